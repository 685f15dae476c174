"""Helpers for the worker tests: the supervisor's process, and HTTP load.

`open_supervisor` runs ``python -m trio_graceful.asgi`` (or any supervisor
command) with its log in a pipe, and waits until its workers and then the
supervisor itself are ready (its ``READY=1`` on a ``NOTIFY_SOCKET`` of the
helper's own);
`run_load` drives raw h11 keep-alive clients against it (every fourth one
pipelines two requests, each reconnects when its connection closes) and
counts what went wrong. Every wait is for a log line or a state, bounded
by `PATIENCE` only as a guard against a hang.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import attrs
import h11
import trio

from tests.support.processes import PATIENCE, ProcessLog

SUPPORT = Path(__file__).resolve().parent
APP = "workers_app:app"
WORKER = re.compile(r"worker (\d+) \(pid (\d+), generation (\d+)\) (\w+)")


def asgi_command(*options: str) -> list[str]:
    """``python -m trio_graceful.asgi`` serving the test app, with ``options``."""
    return [
        sys.executable,
        "-m",
        "trio_graceful.asgi",
        APP,
        "--app-dir",
        str(SUPPORT),
        *options,
    ]


@attrs.define(eq=False)
class Supervisor(ProcessLog):
    """The supervisor's process and its log."""

    port: int = 0
    notifications: list[dict[str, str]] = attrs.field(factory=list)
    """The messages the supervisor sent to the helper's ``NOTIFY_SOCKET``."""
    ready: trio.Event = attrs.field(factory=trio.Event)
    """Set at the supervisor's ``READY=1``."""

    async def read_notifications(
        self,
        manager: trio.socket.SocketType,
        *,
        task_status: trio.TaskStatus[trio.CancelScope],
    ) -> None:
        """Keep the messages sent to ``manager``, as a service manager would."""
        with trio.CancelScope() as scope:
            task_status.started(scope)
            while True:
                datagram = await manager.recv(4096)
                message = dict(
                    line.split("=", 1) for line in datagram.decode().splitlines()
                )
                self.notifications.append(message)
                if message.get("READY") == "1":
                    self.ready.set()

    def worker_pids(self, state: str = "ready") -> dict[int, int]:
        """Worker number -> pid, for each worker whose log line says ``state``."""
        return {
            int(m.group(1)): int(m.group(2))
            for line in self.lines
            if (m := WORKER.search(line)) and m.group(4) == state
        }

    def lines_matching(self, pattern: str) -> list[str]:
        return [line for line in self.lines if re.search(pattern, line)]

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def kill_everything(self) -> None:
        """SIGKILL the supervisor and every worker group it logged."""
        if self.process.returncode is None:
            self.process.kill()
        for pid in self.worker_pids("started").values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


@contextlib.asynccontextmanager
async def open_supervisor(
    command: Sequence[str],
    *,
    workers: int,
    ready: bool = True,
    env: Mapping[str, str] | None = None,
    pass_fds: Sequence[int] = (),
) -> AsyncIterator[Supervisor]:
    """Start ``command``; yield it once ``workers`` workers are ready.

    With ``ready``, wait too for the supervisor's own ``READY=1`` on a
    ``NOTIFY_SOCKET`` of the helper's: the workers say they are ready a
    moment before the supervisor counts them, and a test that signals it in
    between would test another case. Without, ``env`` may name a
    ``NOTIFY_SOCKET`` of the test's. A process still running on the way out
    (a test failed) is killed, with its workers.
    """
    environment = {**os.environ, **(env or {})}
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(SUPPORT.parents[1]), environment.get("PYTHONPATH", "")]
    )
    with contextlib.ExitStack() as stack:
        manager = None
        if ready:
            assert "NOTIFY_SOCKET" not in (env or {}), "the helper listens there"
            folder = stack.enter_context(tempfile.TemporaryDirectory())
            manager = stack.enter_context(
                trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            )
            await manager.bind(os.path.join(folder, "notify"))
            environment["NOTIFY_SOCKET"] = manager.getsockname()
        process = await trio.lowlevel.open_process(
            list(command), stderr=subprocess.PIPE, env=environment, pass_fds=pass_fds
        )
        supervisor = Supervisor(process)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(supervisor.read_log)
                notifying = trio.CancelScope()
                if manager is not None:
                    notifying = await nursery.start(
                        supervisor.read_notifications, manager
                    )
                [listening] = await supervisor.wait_for(r"listening on [^ ]*:(\d+) ")
                supervisor.port = int(listening.group(1))
                await supervisor.wait_for(r"\) ready$", workers)
                if ready:
                    with trio.fail_after(PATIENCE):
                        await supervisor.ready.wait()
                yield supervisor
                supervisor.kill_everything()
                notifying.cancel()
        finally:
            supervisor.kill_everything()
            with trio.CancelScope(shield=True):
                await process.wait()
                assert process.stderr is not None
                await process.stderr.aclose()


@attrs.define
class Tally:
    """What the clients saw."""

    answered: int = 0
    refused: int = 0
    reset: int = 0
    dropped: int = 0
    server_errors: int = 0
    wrong: int = 0
    hung: int = 0
    pids: set[int] = attrs.field(factory=set[int])
    problems: list[str] = attrs.field(factory=list[str])

    def failures(self) -> dict[str, int]:
        return {
            "refused": self.refused,
            "reset": self.reset,
            "dropped": self.dropped,
            "5xx": self.server_errors,
            "wrong": self.wrong,
            "hung": self.hung,
        }


@attrs.define(eq=False)
class Load:
    """Clients running against a port until `stop`; their `tally`."""

    port: int
    tally: Tally = attrs.field(factory=Tally)
    # Requests answered by each process (the x-pid header), and the pids of
    # the connections that broke: a test that kills a worker excuses those.
    ignore_pids: set[int] = attrs.field(factory=set[int])
    # And those of connections that broke before their first answer.
    excuse_unknown: bool = False
    _stopping: trio.Event = attrs.field(factory=trio.Event)
    # Set, and replaced by a fresh one, at every answer.
    _answer: trio.Event = attrs.field(factory=trio.Event)
    _ids: int = 0

    def stop(self) -> None:
        self._stopping.set()

    async def wait_answered(self, count: int) -> None:
        """Wait until ``count`` more requests have been answered."""
        target = self.tally.answered + count
        with trio.fail_after(PATIENCE):
            while self.tally.answered < target:
                await self._answer.wait()

    async def client(self, number: int) -> None:
        rng = random.Random(number)
        pipelining = number % 4 == 0
        while not self._stopping.is_set():
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", self.port)
            except OSError as exc:
                self.tally.refused += 1
                self.tally.problems.append(f"client {number}: connect: {exc!r}")
                await trio.sleep(0.05)
                continue
            async with stream:
                await self._converse(number, stream, rng, 2 if pipelining else 1)

    async def _converse(
        self, number: int, stream: trio.SocketStream, rng: random.Random, batch: int
    ) -> None:
        reader = h11.Connection(h11.CLIENT)
        pid = None
        while not self._stopping.is_set():
            ids: list[int] = []
            data = b""
            for _ in range(batch):
                self._ids += 1
                ids.append(self._ids)
                target = f"/work?ms={rng.randint(20, 200)}&id={self._ids}"
                data += _request_bytes(target)
            try:
                await stream.send_all(data)
            except (trio.BrokenResourceError, OSError) as exc:
                self._broken(number, pid, len(ids), f"send: {exc!r}", reset=True)
                return
            for index, request_id in enumerate(ids):
                reader.send(_request(f"/work?id={request_id}"))
                reader.send(h11.EndOfMessage())
                outcome = await self._response(reader, stream, request_id)
                if isinstance(outcome, str):
                    reset = outcome.startswith("reset")
                    self._broken(number, pid, len(ids) - index, outcome, reset=reset)
                    return
                pid = outcome
                if reader.our_state is h11.MUST_CLOSE:
                    missing = len(ids) - index - 1
                    if missing:
                        self._broken(number, pid, missing, "closed", reset=False)
                    return
                reader.start_next_cycle()

    async def _response(
        self, reader: h11.Connection, stream: trio.SocketStream, request_id: int
    ) -> int | str:
        status = 0
        body = b""
        pid = 0
        with trio.move_on_after(PATIENCE) as waiting:
            while True:
                try:
                    event = reader.next_event()
                except h11.RemoteProtocolError as exc:
                    return f"reset: the answer broke off: {exc}"
                if event is h11.NEED_DATA:
                    try:
                        data = await stream.receive_some()
                    except (trio.BrokenResourceError, OSError) as exc:
                        return f"reset: {exc!r}"
                    reader.receive_data(data)
                    continue
                if isinstance(event, h11.ConnectionClosed):
                    return "closed with a request unanswered"
                if isinstance(event, h11.Response):
                    status = event.status_code
                    pid = int(dict(event.headers).get(b"x-pid", b"0"))
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
        if waiting.cancelled_caught:
            self.tally.hung += 1
            return "hung"
        if status >= 500:
            self.tally.server_errors += 1
            self.tally.problems.append(f"{status} {body!r}")
        elif body != f'{{"id":"{request_id}"}}'.encode():
            self.tally.wrong += 1
            self.tally.problems.append(f"id {request_id}: {status} {body!r}")
        else:
            self.tally.answered += 1
            self.tally.pids.add(pid)
            answer, self._answer = self._answer, trio.Event()
            answer.set()
        return pid

    def _broken(
        self, number: int, pid: int | None, lost: int, what: str, *, reset: bool
    ) -> None:
        if pid in self.ignore_pids or (pid is None and self.excuse_unknown):
            return
        if reset:
            self.tally.reset += 1
        else:
            self.tally.dropped += lost
        self.tally.problems.append(f"client {number} (pid {pid}): {lost} lost, {what}")


def _request(target: str) -> h11.Request:
    return h11.Request(method="GET", target=target, headers=[("Host", "127.0.0.1")])


def _request_bytes(target: str) -> bytes:
    writer = h11.Connection(h11.CLIENT)
    data = writer.send(_request(target))
    assert data is not None
    return data + (writer.send(h11.EndOfMessage()) or b"")


async def get_status(port: int | str, target: str) -> int:
    """The status of ``GET target`` on ``port`` (or a unix socket's path), on a
    connection of its own."""
    stream = (
        await trio.open_unix_socket(port)
        if isinstance(port, str)
        else await trio.open_tcp_stream("127.0.0.1", port)
    )
    async with stream:
        client = h11.Connection(h11.CLIENT)
        await stream.send_all(_request_bytes(target))
        with trio.fail_after(PATIENCE):
            while True:
                event = client.next_event()
                if event is h11.NEED_DATA:
                    client.receive_data(await stream.receive_some())
                elif isinstance(event, h11.Response):
                    return event.status_code


async def get_statusz(port: int) -> dict[str, object]:
    """``/statusz`` of the health endpoint on ``port`` of 127.0.0.1, as JSON."""
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(
            b"GET /statusz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n"
        )
        data = b""
        with trio.fail_after(PATIENCE):
            while chunk := await stream.receive_some():
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.split()[1] == b"200", data
    result: dict[str, object] = json.loads(body)
    return result


@contextlib.asynccontextmanager
async def run_load(port: int, clients: int) -> AsyncIterator[Load]:
    """Run ``clients`` clients against ``port`` for the block; then stop them."""
    load = Load(port)
    async with trio.open_nursery() as nursery:
        for number in range(clients):
            nursery.start_soon(load.client, number)
        yield load
        load.stop()
