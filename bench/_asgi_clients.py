"""What the ASGI benchmarks share: the servers they compare, and raw HTTP/1.1 clients.

The servers (`SERVERS`) all serve ``bench/asgi_app.py``'s app, each in a
process of its own: trio_graceful (``serve_asgi`` under
``trio_graceful.run``), Hypercorn's Trio worker alone, and uvicorn (h11).

The clients speak HTTP/1.1 on Trio over loopback sockets: requests are
written as bytes, several at once when a client pipelines them, and the
responses are parsed with h11. A `ClientConnection` knows, for every request
it sent, whether the server had *received* it, so that a request left
unanswered when the connection closed is told apart from one that was sent
after the server had closed:

* On loopback, the server's FIN is normally delivered in the server's own
  ``close`` or ``shutdown`` call: from then on the client's socket is in TCP
  state CLOSE_WAIT. The client reads that state (``TCP_INFO``) right before
  and right after each write. (On a loaded machine the kernel may deliver a
  loopback segment a little later, from its softirq thread: a request
  written within that moment of the FIN may then be counted either way.)
* Before a write, a connection already in CLOSE_WAIT is stale: the client
  sends nothing more on it, as HTTP clients check a pooled connection
  before they reuse it.
* After a write, a connection still ESTABLISHED means that the bytes were in
  the server's socket before its FIN went out: the server had received the
  request. If it is unanswered when the connection ends, the server dropped
  it.
* A connection in CLOSE_WAIT after the write got the FIN while the request
  was being written: the server had already decided to close, and the
  request is counted as *sent after the FIN*: a client may send it again on
  a new connection (RFC 9112, section 9.3.1, for a request that is
  idempotent, as ``GET /work`` is), and it is not counted as dropped. The
  benchmarks report these in a column of their own: they are the races of
  idle keep-alive connections closed at STOP.

A server that reads a request but closes before it answers, with the bytes
in its buffers, or that closes with a request unread in its socket, drops it
under this rule.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import NamedTuple

import attrs
import h11
import trio
from _rolling import TCP_ESTABLISHED, Replica, running, tcp_state

BENCH = Path(__file__).resolve().parent
GRACE = 5.0  # each server's graceful timeout, or trio_graceful's --grace


class Server(NamedTuple):
    label: str
    command: tuple[str, ...]
    listening: str
    """What its log says when it listens; group 1 is the port."""


SERVERS = {
    "trio_graceful": Server(
        "trio_graceful.asgi.serve_asgi under trio_graceful.run",
        (str(BENCH / "asgi_app.py"), "--port", "0", "--grace", f"{GRACE:g}"),
        r"listening on http://127\.0\.0\.1:(\d+)",
    ),
    "hypercorn": Server(
        "Hypercorn's Trio worker alone (--graceful-timeout)",
        (
            *("-m", "hypercorn", "--worker-class", "trio"),
            *("--bind", "127.0.0.1:0", "--graceful-timeout", f"{GRACE:g}"),
            "asgi_app:app",
        ),
        r"Running on http://127\.0\.0\.1:(\d+)",
    ),
    "uvicorn": Server(
        "uvicorn, h11 (--timeout-graceful-shutdown)",
        (
            *("-m", "uvicorn", "--host", "127.0.0.1", "--port", "0", "--http", "h11"),
            *("--timeout-graceful-shutdown", f"{GRACE:g}", "--no-access-log"),
            "asgi_app:app",
        ),
        r"running on http://127\.0\.0\.1:(\d+)",
    ),
}
STARTUP_TIMEOUT = 60.0  # a bound against hangs on a busy machine, not a target
OPEN_AT_ONCE = 50  # connections being opened at the same time


def _interruptible() -> None:
    """Let SIGINT stop the server, even if this process was started ignoring it.

    A shell starts background jobs with SIGINT ignored, which their children
    inherit; Python then installs no handler for it.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@asynccontextmanager
async def serving(
    kind: str,
    *,
    prefix: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    startup_timeout: float = STARTUP_TIMEOUT,
    options: Sequence[str] = (),
) -> AsyncIterator[tuple[Replica, int]]:
    """Run the server ``kind`` under ``prefix`` (valgrind...); yield it and its port.

    ``options`` are added to its command line. On exit, kill it and what it
    started (Hypercorn runs its worker in a process of its own) if they
    still run.
    """
    spec = SERVERS[kind]
    command = [*prefix, sys.executable, *spec.command, *options]
    # cwd: Hypercorn and uvicorn import asgi_app from the current directory.
    async with running(
        kind,
        command,
        cwd=BENCH,
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_interruptible,
    ) as server:
        try:
            with trio.fail_after(startup_timeout):
                port = int((await server.wait_logged(spec.listening)).group(1))
            yield server, port
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.process.pid, signal.SIGKILL)


# -- the clients --------------------------------------------------------------

MAX_RECV = 65536


def request_bytes(request_id: int, work_ms: int) -> bytes:
    return (
        f"GET /work?ms={work_ms}&id={request_id} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    ).encode()


class Stale(Exception):
    """The server's FIN was already there: nothing was sent."""


class Sent(NamedTuple):
    request_id: int
    end: int
    """Where its last byte is in what the connection has sent."""
    received: bool
    """The server had received it (see the module docstring)."""


class Answer(NamedTuple):
    request_id: int
    status: int
    close: bool
    """The response said ``Connection: close``."""
    at: float
    """`trio.current_time` when it was complete."""


@attrs.define(eq=False)
class ClientConnection:
    """One keep-alive connection: pipelined writes, parsed responses, the books.

    `send` writes requests; `receive` returns the next response, or None
    when the connection has ended (EOF or reset). Each request sent is in
    `outstanding` until its answer comes, with whether the server had
    received it.
    """

    stream: trio.SocketStream
    parser: h11.Connection = attrs.field(factory=lambda: h11.Connection(h11.CLIENT))
    outstanding: collections.deque[Sent] = attrs.field(factory=collections.deque[Sent])
    """The requests not answered yet."""
    sent: int = 0
    bytes_sent: int = 0
    sent_after_fin: int = 0
    """Requests that were being written as the server's FIN came (see the module)."""
    answers: list[Answer] = attrs.field(factory=list[Answer])
    ended: str = ""
    """How it ended: "eof", "reset", or "" while it is open."""

    @classmethod
    async def open(cls, port: int) -> ClientConnection:
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    @property
    def stale(self) -> bool:
        """True if the server's FIN (or RST) has come."""
        try:
            return tcp_state(self.stream.socket) != TCP_ESTABLISHED
        except OSError:
            return True

    async def send(self, requests: Sequence[tuple[int, int]]) -> None:
        """Write ``(request id, work ms)`` requests in one write.

        Raises:
            Stale: if the server's FIN had come before: nothing was sent.
        """
        if self.stale:
            raise Stale
        data = b"".join(request_bytes(*request) for request in requests)
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            received = False  # reset: the server had closed already
        else:
            received = not self.stale
        self.sent += len(requests)
        if not received:
            self.sent_after_fin += len(requests)
        for request_id, work_ms in requests:
            self.bytes_sent += len(request_bytes(request_id, work_ms))
            self.outstanding.append(Sent(request_id, self.bytes_sent, received))

    async def receive(self) -> Answer | None:
        """The next response, or None when the connection has ended."""
        if self.ended or not self.outstanding:
            return None
        parser = self.parser
        if parser.our_state is h11.IDLE:
            # The parser's side of the request already went out as bytes.
            parser.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
            parser.send(h11.EndOfMessage())
        status = 0
        close = False
        while True:
            event = parser.next_event()
            if event is h11.NEED_DATA:
                data = await self._receive_some()
                if not data:
                    return None
                parser.receive_data(data)
            elif isinstance(event, h11.Response):
                status = event.status_code
                close = (b"connection", b"close") in [
                    (name, value.lower()) for name, value in event.headers
                ]
            elif isinstance(event, h11.EndOfMessage):
                request_id = self.outstanding.popleft().request_id
                answer = Answer(request_id, status, close, trio.current_time())
                self.answers.append(answer)
                if parser.our_state is h11.DONE and parser.their_state is h11.DONE:
                    parser.start_next_cycle()
                return answer
            # h11.Data: the body is {"id": K}; the order of answers tells which

    async def _receive_some(self) -> bytes:
        try:
            data = await self.stream.receive_some(MAX_RECV)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.ended = "reset"
        else:
            if data:
                return bytes(data)
            self.ended = "eof"
        # Closed at once, as a client does: a server may wait for this FIN.
        await self.aclose()
        return b""

    async def wait_closed(self) -> None:
        """Read until the server closes (what comes is dropped)."""
        while not self.ended:
            await self._receive_some()

    @property
    def dropped(self) -> int:
        """Requests the server had received and never answered (once ended)."""
        return sum(sent.received for sent in self.outstanding)

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


async def open_connections(port: int, count: int) -> list[ClientConnection]:
    limit = trio.CapacityLimiter(OPEN_AT_ONCE)
    connections: list[ClientConnection | None] = [None] * count

    async def open_one(index: int) -> None:
        async with limit:
            connections[index] = await ClientConnection.open(port)

    async with trio.open_nursery() as nursery:
        for index in range(count):
            nursery.start_soon(open_one, index)
    return [c for c in connections if c is not None]


def last_response_said_close(connection: ClientConnection) -> bool:
    return bool(connection.answers) and connection.answers[-1].close


def notice(connection: ClientConnection, signalled_at: float) -> str:
    """How a connection that has ended was closed, for the drain's books.

    * ``"close"``: its last response said ``Connection: close``;
    * ``"idle"``: closed between requests: its last response came before the
      signal and the server had received nothing it left unanswered (a FIN
      on an idle keep-alive connection: a client retries on a new one);
    * ``"none"``: otherwise: the server knew it would close after a response
      and did not say so, or closed with requests unanswered.
    """
    if last_response_said_close(connection):
        return "close"
    before = not connection.answers or connection.answers[-1].at < signalled_at
    if before and connection.dropped == 0:
        return "idle"
    return "none"
