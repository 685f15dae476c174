"""The ASGI example as a real process, and the raw clients that talk to it.

`open_service` starts ``examples/asgi_service.py`` on port 0 and reads its
log line by line (`Service.wait_for` waits for a line, never for a time).
`H11Client` is an HTTP/1.1 client on a plain Trio socket, with `h11` parsing
what the server sends: it keeps its connection alive, pipelines (all the
requests of one `H11Client.send` go out in one write, before any answer is
read), and tells an orderly close (FIN: end of file) from a reset (RST),
which a library client would hide. `WebSocketClient` speaks the example's
request protocol with the `websockets` library.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import attrs
import h11
import trio
from websockets.exceptions import ConnectionClosedOK
from websockets.sync.client import ClientConnection, connect

from tests.support.examples import EXAMPLES
from tests.support.processes import PATIENCE, ProcessLog, open_logged_process

EXAMPLE = EXAMPLES / "asgi_service.py"
LISTENING = r"listening on http://127\.0\.0\.1:(\d+)"
STOP_LINE = r"trio_graceful\.asgi: STOP: draining"
"""The server's line once it has got STOP: its listeners are closed."""


@attrs.define(eq=False)
class Service(ProcessLog):
    """A running example process and its log (stderr), read line by line."""

    @property
    def port(self) -> int:
        assert self.ready is not None
        return int(self.ready.group(1))

    def logged(self, pattern: str) -> bool:
        """Whether a log line so far matches ``pattern``."""
        return any(re.search(pattern, line) for line in self.lines)

    def check_graceful_exit(self, status: int) -> None:
        """The exit status is 0; the log has no traceback, and nothing was forced."""
        text = self.log()
        assert "Traceback" not in text, text
        assert "forcing" not in text, text
        assert status == 0, text


@contextlib.asynccontextmanager
async def open_service(*args: str) -> AsyncIterator[Service]:
    """Run the example on port 0 with ``args``; yield it once it listens.

    A process still running on the way out (a test failed) is killed.
    """
    command = [sys.executable, str(EXAMPLE), "--port", "0", *args]
    async with open_logged_process(command, Service, ready=LISTENING) as service:
        yield service


def shutdown_time(marker: Path) -> float:
    """Check the marker holds ``startup`` then ``shutdown <time>``; return the time."""
    first, second = marker.read_text().splitlines()
    word, _, at = second.partition(" ")
    assert (first, word) == ("startup", "shutdown"), marker.read_text()
    return float(at)


def encode_get(target: str) -> bytes:
    """A ``GET target`` request, as a client sends it."""
    encoder = h11.Connection(h11.CLIENT)
    request = h11.Request(method="GET", target=target, headers=[("Host", "127.0.0.1")])
    head = encoder.send(request)
    end = encoder.send(h11.EndOfMessage())
    assert head is not None
    assert end is not None
    return head + end


@attrs.define(eq=False)
class Reply:
    """One response, as far as it has come."""

    target: str
    status: int = 0
    headers: dict[bytes, bytes] = attrs.field(factory=dict[bytes, bytes])
    body: bytes = b""
    complete: bool = False
    """The whole message came: for a chunked one, its terminating chunk."""
    completed_at: float = 0.0
    """`time.time` when it was complete."""

    @property
    def closes(self) -> bool:
        """Whether it says ``Connection: close``."""
        return self.headers.get(b"connection") == b"close"

    @property
    def answer_id(self) -> object:
        """The ``id`` of a JSON answer."""
        answer: dict[str, object] = json.loads(self.body)
        return answer["id"]


@attrs.define(eq=False)
class H11Client:
    """A keep-alive, pipelining HTTP/1.1 client on one connection."""

    stream: trio.SocketStream
    _parser: h11.Connection = attrs.field(factory=lambda: h11.Connection(h11.CLIENT))
    _sent: deque[str] = attrs.field(factory=deque[str])
    _current: Reply | None = None

    async def send(self, *targets: str) -> None:
        """Send a GET for each of ``targets``, all in one write."""
        self._sent.extend(targets)
        await self.stream.send_all(b"".join(encode_get(t) for t in targets))

    async def get(self, target: str) -> Reply:
        """Send one request and return its whole response."""
        await self.send(target)
        return await self.reply()

    async def reply(self, *, until: Callable[[Reply], bool] | None = None) -> Reply:
        """Read the response to the oldest request not answered yet.

        Reads until it is complete or, with ``until``, until ``until(reply)``
        is true (call again to read the rest).
        """
        with trio.fail_after(PATIENCE):
            reply = self._current or self._begin_reply()
            while not reply.complete and not (until is not None and until(reply)):
                event = self._parser.next_event()
                if event is h11.NEED_DATA:
                    data = await self._receive()
                    assert data, f"closed in the middle of {reply}"
                    self._parser.receive_data(data)
                elif isinstance(event, h11.Response):
                    reply.status = event.status_code
                    reply.headers = dict(event.headers)
                elif isinstance(event, h11.Data):
                    reply.body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    reply.complete = True
                    reply.completed_at = time.time()
                    self._current = None
            return reply

    async def replies(self, count: int) -> list[Reply]:
        """The whole responses to the ``count`` oldest requests not answered yet."""
        return [await self.reply() for _ in range(count)]

    def _begin_reply(self) -> Reply:
        assert self._sent, "no request waits for a response"
        parser = self._parser
        assert parser.our_state is not h11.MUST_CLOSE, (
            "the previous response said Connection: close: no other can follow"
        )
        if parser.our_state is h11.DONE:
            parser.start_next_cycle()
        target = self._sent.popleft()
        # The parser must see each request (already sent) before its answer.
        request = h11.Request(method="GET", target=target, headers=[("Host", "x")])
        parser.send(request)
        parser.send(h11.EndOfMessage())
        self._current = Reply(target)
        return self._current

    async def receive_eof(self) -> float:
        """Wait for the server to close: FIN, not RST. Return `time.time` then.

        Fails if anything but the end of the stream comes (a response to a
        request not sent, say).
        """
        with trio.fail_after(PATIENCE):
            leftover, _ = self._parser.trailing_data
            assert not leftover, f"unexpected bytes: {leftover!r}"
            data = await self._receive()
        assert data == b"", f"unexpected bytes: {data!r}"
        return time.time()

    async def _receive(self) -> bytes:
        try:
            return bytes(await self.stream.receive_some())
        except trio.BrokenResourceError as exc:
            raise AssertionError("the server reset the connection (RST)") from exc


@contextlib.asynccontextmanager
async def open_h11_client(port: int) -> AsyncIterator[H11Client]:
    """Connect an `H11Client`, and get one answer, so the server has accepted it.

    A connection still in the listener's queue when the server gets STOP
    would be reset with the listener: a test's connections must be served
    before.
    """
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        client = H11Client(stream)
        reply = await client.get("/work?ms=0&id=0")
        assert (reply.status, reply.answer_id) == (200, 0), reply
        yield client


@attrs.define(eq=False)
class WebSocketClient:
    """A client of the `websockets` library (its sync API, run in threads)."""

    connection: ClientConnection
    closed_at: float = 0.0
    """`trio.current_time` when the connection had closed (TCP included)."""

    async def send_request(self, request_id: int, work_ms: int) -> None:
        text = json.dumps({"id": request_id, "work_ms": work_ms})
        await trio.to_thread.run_sync(self.connection.send, text)

    async def answer(self) -> int | None:
        """The id of the next answer; None once the server has closed cleanly.

        A close that is not clean (no CLOSE frames both ways, a reset)
        raises `websockets.exceptions.ConnectionClosedError`.
        """
        try:
            text = await trio.to_thread.run_sync(self.connection.recv, PATIENCE)
        except ConnectionClosedOK:
            self.closed_at = trio.current_time()
            return None
        answer: dict[str, int] = json.loads(text)
        return answer["id"]


@contextlib.asynccontextmanager
async def open_websocket(port: int) -> AsyncIterator[WebSocketClient]:
    """Open a WebSocket on ``port`` with the `websockets` client."""
    open_connection = functools.partial(
        connect,
        f"ws://127.0.0.1:{port}/requests",
        proxy=None,
        open_timeout=PATIENCE,
        ping_interval=None,
        legacy=True,  # a connection, not a context manager (closed below)
    )
    connection = await trio.to_thread.run_sync(open_connection)
    try:
        yield WebSocketClient(connection)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(connection.close)
