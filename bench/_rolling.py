"""The orchestrator of a simulated rolling restart: replicas, probes, rotation, proxy.

It plays what Kubernetes does to a Deployment's pods, on loopback:

* each replica is a real process of an example (`KINDS`):
  ``examples/websocket_close_server.py``, started with ``--port 0
  --health-port 0``, or the ASGI service ``examples/asgi_service.py``, whose
  ``/readyz`` is on its own port; its log says where it listens;
* a prober asks every replica's ``GET /readyz`` every `PROBE_PERIOD`
  seconds (with h11, as a kubelet would);
* a TCP proxy sends each new client connection to the next replica *in
  rotation* (round-robin) and splices the two connections byte for byte
  until either side closes; like kube-proxy it never retries a connection
  on another replica; for each connection it counts the bytes the replica
  had received before it closed, which tells an HTTP client whether a
  request left unanswered had reached the replica;
* a restart sends SIGTERM, takes the replica out of rotation only once its
  readiness has failed *and* ``lag`` seconds have passed since the SIGTERM
  (the endpoint removal reaching every node late), SIGKILLs it if it has not
  exited within ``termination_grace``, starts the replacement and puts it in
  rotation once its ``/readyz`` answers 200.

Every step is recorded, with `time.time`, in the replica's `Replica.events`.
"""

from __future__ import annotations

import collections
import datetime
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

import attrs
import h11
import trio

ROOT = Path(__file__).resolve().parent.parent
PROBE_PERIOD = 0.1
PROBE_TIMEOUT = 1.0
STARTUP_TIMEOUT = 60.0  # a bound against hangs on a busy machine, not a target
TCP_ESTABLISHED = 1


class Kind(NamedTuple):
    """An example a replica runs, and the lines of its log the orchestrator reads."""

    script: Path
    options: tuple[str, ...]
    listening: str
    """Group 1 is the port."""
    health: str | None
    """Group 1 is the health endpoint's port; None: ``/readyz`` on the port."""
    stopped: str
    """The line it logs at STOP, when it stops accepting."""


LISTENING = r"listening on ws://127\.0\.0\.1:(\d+)/"
"""The WebSocket example's line once it listens; group 1 is the port."""
HEALTH = r"health endpoint on .*?(\d+)/?$"
"""The health endpoint's line (the example's, a URL, or the runner's, ``on
port N``); group 1 is the port."""

KINDS = {
    "websocket": Kind(
        ROOT / "examples" / "websocket_close_server.py",
        ("--port", "0", "--health-port", "0", "--log-level", "INFO"),
        LISTENING,
        HEALTH,
        r"stopped accepting",
    ),
    "http": Kind(
        ROOT / "examples" / "asgi_service.py",
        ("--port", "0"),
        r"listening on http://127\.0\.0\.1:(\d+)",
        None,
        r"STOP: draining",
    ),
}


def tcp_state(sock: trio.socket.SocketType) -> int:
    """The TCP state of a socket (Linux ``tcp_info.tcpi_state``).

    On loopback a peer's FIN is delivered within the peer's own ``close`` or
    ``shutdown`` call: from then on the socket is no longer ESTABLISHED.
    """
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


def logged_at(line: str) -> float:
    """The `time.time` of a line the example logged (its format's asctime)."""
    stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


async def http_get(port: int, target: str) -> tuple[int, bytes] | None:
    """``GET target`` on loopback: the status and the body, or None if no answer."""
    client = h11.Connection(h11.CLIENT)
    request = h11.Request(
        method="GET",
        target=target,
        headers=[("Host", "127.0.0.1"), ("Connection", "close")],
    )
    status = 0
    body = b""
    try:
        with trio.fail_after(PROBE_TIMEOUT):
            async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
                await stream.send_all(
                    client.send(request) + client.send(h11.EndOfMessage())
                )
                while True:
                    event = client.next_event()
                    if event is h11.NEED_DATA:
                        client.receive_data(await stream.receive_some())
                    elif isinstance(event, h11.Response):
                        status = event.status_code
                    elif isinstance(event, h11.Data):
                        body += event.data
                    elif isinstance(event, h11.EndOfMessage):
                        return status, body
                    else:
                        return None
    except (OSError, trio.TooSlowError, trio.BrokenResourceError, h11.ProtocolError):
        return None


async def probe(port: int, target: str = "/readyz") -> int | None:
    """The status code of ``GET target``, or None if nothing answered."""
    response = await http_get(port, target)
    return None if response is None else response[0]


async def wait_ready(port: int) -> None:
    """Probe ``/readyz`` every `PROBE_PERIOD` until it answers 200."""
    while True:  # a probe's answer is the only way to know
        if await probe(port) == 200:
            return
        await trio.sleep(PROBE_PERIOD)


@attrs.define(eq=False)
class Replica:
    """One server process, its log, its ports and what happened to it."""

    name: str
    process: trio.Process
    lines: list[str] = attrs.field(factory=list[str])
    arrived: list[float] = attrs.field(factory=list[float])
    """When each line was read (`time.time`)."""
    port: int = 0
    health_port: int = 0
    ready: bool = False
    """What the last probe said: ``/readyz`` answered 200."""
    events: dict[str, float] = attrs.field(factory=dict[str, float])
    """What happened to it, and when (`time.time`): see `Orchestrator`."""
    refused_connections: int = 0
    """Connections the proxy sent here that it could not open."""
    _log_changed: trio.Event = attrs.field(factory=trio.Event)
    _log_ended: bool = False
    _readiness_changed: trio.Event = attrs.field(factory=trio.Event)

    async def reap(self) -> None:
        """Kill the process if it still runs; wait for it; close its log pipe."""
        with trio.CancelScope(shield=True):
            if self.process.returncode is None:
                self.process.kill()
            await self.process.wait()
            assert self.process.stderr is not None
            await self.process.stderr.aclose()

    def record(self, event: str, at: float | None = None) -> None:
        """Note the first time ``event`` happened; later ones are ignored."""
        self.events.setdefault(event, time.time() if at is None else at)

    async def read_log(self) -> None:
        assert self.process.stderr is not None
        pending = b""
        async for chunk in self.process.stderr:
            *complete, pending = (pending + chunk).split(b"\n")
            self.lines.extend(line.decode(errors="replace") for line in complete)
            self.arrived.extend([time.time()] * len(complete))
            self._log_changed.set()
            self._log_changed = trio.Event()
        self._log_ended = True
        self._log_changed.set()

    async def wait_logged(self, pattern: str) -> re.Match[str]:
        """Wait for the first log line that matches ``pattern``."""
        seen = 0
        while True:
            for line in self.lines[seen:]:
                if match := re.search(pattern, line):
                    return match
            seen = len(self.lines)
            if self._log_ended:
                log = "\n".join(self.lines)
                raise RuntimeError(f"{self.name} never logged {pattern!r}:\n{log}")
            await self._log_changed.wait()

    def logged_time(self, pattern: str) -> float | None:
        """When the first line matching ``pattern`` was logged, if it was.

        The line's own time if it has one, else when it was read.
        """
        for line, arrived in zip(self.lines, self.arrived, strict=True):
            if re.search(pattern, line):
                try:
                    return logged_at(line)
                except ValueError:
                    return arrived
        return None

    def set_ready(self, ready: bool) -> None:
        if ready != self.ready:
            self.ready = ready
            self._readiness_changed.set()
            self._readiness_changed = trio.Event()

    async def wait_readiness(self, ready: bool) -> None:
        while self.ready != ready:
            await self._readiness_changed.wait()

    async def poll_readiness(self) -> None:
        """Probe ``/readyz`` every `PROBE_PERIOD` until the process has exited."""
        while self.process.returncode is None:
            ready = await probe(self.health_port) == 200
            if ready:
                self.record("ready")
            elif "sigterm" in self.events:
                self.record("readiness_false")
            self.set_ready(ready)
            await trio.sleep(PROBE_PERIOD)
        self.set_ready(False)


@attrs.define(eq=False)
class Orchestrator:
    """Two (or more) replicas in slots, a rotation, and the restarts."""

    nursery: trio.Nursery
    kind: Kind
    server_args: Sequence[str]
    lag: float
    termination_grace: float
    slots: list[Replica] = attrs.field(factory=list[Replica])
    """The replica of each slot: the one running, or the last one started."""
    started: list[Replica] = attrs.field(factory=list[Replica])
    """Every replica started, in order."""
    rotation: list[Replica] = attrs.field(factory=list[Replica])
    """Replicas new connections may go to; a replacement joins at the end."""
    retired: list[Replica] = attrs.field(factory=list[Replica])
    """The replicas restarted, in order."""
    replacements: list[Replica] = attrs.field(factory=list[Replica])
    """Their replacements, in the same order."""
    _next: int = 0

    def pick(self) -> Replica | None:
        """The replica for a new connection: round-robin over the rotation."""
        if not self.rotation:
            return None
        self._next = (self._next + 1) % len(self.rotation)
        return self.rotation[self._next]

    async def start_replica(self) -> Replica:
        """Start a replica, wait until it is ready, put it in rotation."""
        command = [
            sys.executable,
            str(self.kind.script),
            *self.kind.options,
            *self.server_args,
        ]
        process = await trio.lowlevel.open_process(command, stderr=subprocess.PIPE)
        replica = Replica(f"replica-{len(self.started)}", process)
        self.started.append(replica)
        replica.record("started")
        self.nursery.start_soon(replica.read_log)
        try:
            with trio.fail_after(STARTUP_TIMEOUT):
                listening = await replica.wait_logged(self.kind.listening)
                replica.port = replica.health_port = int(listening.group(1))
                if self.kind.health is not None:
                    health = await replica.wait_logged(self.kind.health)
                    replica.health_port = int(health.group(1))
                self.nursery.start_soon(replica.poll_readiness)
                await replica.wait_readiness(True)
        except BaseException:
            process.kill()
            raise
        self.rotation.append(replica)
        replica.record("added")
        return replica

    async def restart(self, slot: int) -> Replica:
        """Stop the replica in ``slot`` as Kubernetes would; return its successor."""
        old = self.slots[slot]
        old.process.send_signal(signal.SIGTERM)
        old.record("sigterm")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._withdraw, old)
            with trio.move_on_after(self.termination_grace):
                await old.process.wait()
            if old.process.returncode is None:
                old.process.kill()
                old.record("sigkill")
                await old.process.wait()
            old.record("exited")
        self.retired.append(old)
        new = self.slots[slot] = await self.start_replica()
        self.replacements.append(new)
        return new

    async def _withdraw(self, replica: Replica) -> None:
        """Take ``replica`` out of rotation once unready, ``lag`` after its SIGTERM."""
        await replica.wait_readiness(False)
        await trio.sleep_until(
            trio.current_time() + replica.events["sigterm"] + self.lag - time.time()
        )
        if replica in self.rotation:
            self.rotation.remove(replica)
        replica.record("removed")


async def splice(
    source: trio.SocketStream,
    sink: trio.SocketStream,
    delivered: Callable[[int], None] | None = None,
) -> None:
    """Copy bytes from ``source`` to ``sink`` until either end closes.

    ``delivered(n)`` is told of the bytes that reached ``sink``'s peer before
    its FIN (`tcp_state` right after the write).
    """
    try:
        while data := await source.receive_some():
            await sink.send_all(data)
            if delivered is not None and tcp_state(sink.socket) == TCP_ESTABLISHED:
                delivered(len(data))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


@attrs.define(eq=False)
class Proxy:
    """A loopback TCP proxy in front of the orchestrator's rotation."""

    orchestrator: Orchestrator
    port: int = 0
    routes: dict[int, Replica] = attrs.field(factory=dict[int, Replica])
    """Client port -> the replica its connection went to."""
    unrouted: int = 0
    """Connections that came while no replica was in rotation."""
    delivered: collections.Counter[int] = attrs.field(factory=collections.Counter[int])
    """Client port -> the bytes from the client its replica had received
    before it closed (`splice`)."""
    refused: set[int] = attrs.field(factory=set[int])
    """Client ports whose connection to the replica could not be opened."""

    def route_of(self, client_port: int) -> str:
        """The name of the replica the connection from ``client_port`` went to."""
        return self.routes[client_port].name

    async def serve(self, *, task_status: trio.TaskStatus[None]) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1", backlog=4096)
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._forward, listeners)

    async def _forward(self, client: trio.SocketStream) -> None:
        async with client:
            replica = self.orchestrator.pick()
            if replica is None:
                self.unrouted += 1
                return
            client_port = client.socket.getpeername()[1]
            self.routes[client_port] = replica
            try:
                backend = await trio.open_tcp_stream("127.0.0.1", replica.port)
            except OSError:
                self.refused.add(client_port)
                replica.refused_connections += 1
                replica.record("first_refused_connection")
                return
            async with backend, trio.open_nursery() as nursery:

                def count(n: int) -> None:
                    self.delivered[client_port] += n

                async def one_way(
                    source: trio.SocketStream,
                    sink: trio.SocketStream,
                    delivered: Callable[[int], None] | None = None,
                ) -> None:
                    await splice(source, sink, delivered)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(one_way, client, backend, count)
                nursery.start_soon(one_way, backend, client)


@asynccontextmanager
async def open_cluster(
    server_args: Sequence[str],
    *,
    kind: Kind = KINDS["websocket"],
    replicas: int,
    lag: float,
    termination_grace: float,
) -> AsyncIterator[tuple[Orchestrator, Proxy]]:
    """Start the replicas and the proxy; on exit, kill whatever still runs."""
    orchestrator: Orchestrator | None = None
    try:
        async with trio.open_nursery() as nursery:
            orchestrator = Orchestrator(
                nursery, kind, server_args, lag=lag, termination_grace=termination_grace
            )
            proxy = Proxy(orchestrator)
            try:
                await nursery.start(proxy.serve)
                for _ in range(replicas):
                    orchestrator.slots.append(await orchestrator.start_replica())
                yield orchestrator, proxy
            finally:
                for replica in orchestrator.started:
                    if replica.process.returncode is None:
                        replica.process.kill()
                nursery.cancel_scope.cancel()
    finally:
        for replica in () if orchestrator is None else orchestrator.started:
            await replica.reap()


@asynccontextmanager
async def running(
    name: str, command: Sequence[str], **options: Any
) -> AsyncIterator[Replica]:
    """Run ``command`` with its stderr read into `Replica.lines`; then reap it.

    ``options`` go to `trio.lowlevel.open_process` (``cwd``, ``env``...).
    """
    process = await trio.lowlevel.open_process(
        command, stderr=subprocess.PIPE, **options
    )
    replica = Replica(name, process)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(replica.read_log)
            try:
                yield replica
            finally:
                replica.process.kill()  # so that its log ends
    finally:
        await replica.reap()
