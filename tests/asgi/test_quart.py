"""The rules of `trio_graceful.asgi.serve_asgi`, for a Quart-Trio app.

The app is examples/quart_service.py's, with hooks and routes that the tests
need: each request records its arrival, the lifespan's shutdown records what
was still open, ``/hold`` waits until the test releases it, ``/stop-info``
answers once the app has heard STOP, ``/thread`` is a sync view (run in a
thread) that waits on its stop flag, and ``/hang`` and ``/drip`` ignore STOP
(a handler that never answers, a stream that never ends), to be cut off.

The server runs in-process, in a bundle, on real loopback sockets, so the
clock is real. The clients are real too: `Wire` (raw HTTP/1.1 that
pipelines, keeps connections alive, and tells a FIN from a reset), httpx,
`WireClient` (WebSocket frames) and the `websockets` library's own client.
The tests wait for what they check (a response, an arrival, the app's
answer to STOP), never for a fixed time. The grace is long (`PATIENCE`)
except where the cut-off is the point: there it is 1 s.
"""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import attrs
import h11
import httpx
import pytest
import trio
import trio.testing
import wsproto.events
from quart import Response, request, websocket
from quart_trio import QuartTrio
from websockets.exceptions import ConnectionClosedOK
from websockets.sync.client import connect as websockets_connect

import trio_graceful
import trio_graceful.asgi

from ..examples_loader import EXAMPLES, load_example
from ..process_support import PATIENCE, LineReader, running
from ..websocket_clients import open_wire_client

pytestmark = pytest.mark.realtime

example = load_example("quart_service")

# Linux's TCP state once a FIN has come in; a reset leaves it CLOSE (7).
CLOSE_WAIT = 8
SHUTTING_DOWN = (1001, "the server is shutting down")
# What the lifespan saw: its shutdown came after the last connection.
LIFESPAN = ["startup", "shutdown: 0 connections open, 0 requests running"]


# -- a raw HTTP/1.1 client ------------------------------------------------------


@attrs.frozen
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@attrs.define(eq=False)
class Wire:
    """HTTP/1.1 on one socket, as raw as a test needs it.

    `send` writes requests back to back (pipelined); `head`, `body` and
    `response` read one response at a time with h11, keeping what follows
    it; `raw` is every byte received. `fin` checks that the server closed
    with a FIN and no reset (Linux's TCP state says which came).
    """

    stream: trio.SocketStream
    raw: bytes = b""
    _unparsed: bytes = b""
    _eof: bool = False
    _parser: h11.Connection = attrs.field(init=False)

    async def send(self, *targets: str) -> None:
        await self.stream.send_all(
            b"".join(
                f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
                for target in targets
            )
        )

    async def head(self) -> h11.Response:
        # h11 reads a response only after its own request: pretend one.
        parser = h11.Connection(h11.CLIENT)
        parser.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
        parser.send(h11.EndOfMessage())
        if self._unparsed:  # receive_data(b"") would mean end of file
            parser.receive_data(self._unparsed)
            self._unparsed = b""
        self._parser = parser
        event = await self._next()
        assert isinstance(event, h11.Response), event
        return event

    async def body(self) -> bytes:
        body = b""
        while not isinstance(event := await self._next(), h11.EndOfMessage):
            assert isinstance(event, h11.Data), event
            body += event.data
        self._unparsed = self._parser.trailing_data[0]
        return body

    async def response(self) -> Reply:
        head = await self.head()
        headers = {name.decode(): value.decode() for name, value in head.headers}
        return Reply(head.status_code, headers, await self.body())

    async def _next(self) -> object:
        while (event := self._parser.next_event()) is h11.NEED_DATA:
            data = await self.stream.receive_some()
            self.raw += data
            self._parser.receive_data(data)
        return event

    async def replies(self) -> list[Reply]:
        """Read responses until the server closes, then check the close (`fin`)."""
        replies: list[Reply] = []
        while self._unparsed or await self._more():
            replies.append(await self.response())
        await self.fin()
        return replies

    async def _more(self) -> bool:
        data = await self.stream.receive_some()
        self.raw += data
        self._unparsed = data
        self._eof = not data
        return not self._eof

    async def fin(self) -> None:
        """Check that the server closed with a FIN, and has sent no reset."""
        assert self._unparsed == b""
        if not self._eof:
            assert await self.stream.receive_some() == b""
        assert_fin_not_reset(self.stream)
        await self.stream.aclose()


def assert_fin_not_reset(stream: trio.SocketStream) -> None:
    """Check that ``stream`` got a FIN (end of file was read), and no reset."""
    state = stream.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
    assert state == CLOSE_WAIT, f"TCP state {state}: the server reset the connection"


# -- the app and its server --------------------------------------------------------


@attrs.define(eq=False)
class Served:
    """The test app's server, and what its app recorded."""

    arrivals: list[str] = attrs.field(factory=list)
    lifespan: list[str] = attrs.field(factory=list)
    release: trio.Event = attrs.field(factory=trio.Event)
    report: trio_graceful.CancelReport | None = None
    _arrived: trio.Event = attrs.field(factory=trio.Event)
    _wires: list[Wire] = attrs.field(factory=list)
    bundle: trio_graceful.Bundle = attrs.field(init=False)
    server: trio_graceful.asgi.AsgiServer = attrs.field(init=False)

    @property
    def port(self) -> int:
        return self.server.addresses[0][1]

    async def wire(self) -> Wire:
        """Connect a `Wire` to the server (closed at the end of `serving`)."""
        wire = Wire(await trio.open_tcp_stream("127.0.0.1", self.port))
        self._wires.append(wire)
        return wire

    def close_wires(self) -> None:
        for wire in self._wires:
            wire.stream.socket.close()

    def arrive(self, what: str) -> None:
        self.arrivals.append(what)
        self._arrived.set()
        self._arrived = trio.Event()

    async def wait_arrived(self, *what: str) -> None:
        """Wait until the app has begun the requests ``what`` (``GET /path``)."""
        while not set(what) <= set(self.arrivals):
            await self._arrived.wait()

    async def shutdown(self, grace: float) -> None:
        self.report = await self.bundle.shutdown(grace=grace)

    async def stop(self, nursery: trio.Nursery, grace: float = PATIENCE) -> Reply:
        """Begin the shutdown, and return once the app has heard STOP.

        The app's word for it is the answer to ``/stop-info``, sent before.
        """
        info = await self.wire()
        await info.send("/stop-info")
        await self.wait_arrived("GET /stop-info")
        nursery.start_soon(self.shutdown, grace)
        reply = await info.response()
        await info.fin()
        return reply

    def assert_drained(self) -> None:
        """Check that the server ended in its grace, the lifespan last."""
        assert self.report is not None
        assert self.report.graceful
        assert self.lifespan == LIFESPAN

    async def refused(self) -> None:
        """Check that a new connection is refused: the listener is closed."""
        with pytest.raises(OSError, match=r"^all attempts to connect to .* failed$"):
            await trio.open_tcp_stream("127.0.0.1", self.port)


def make_app(served: Served) -> QuartTrio:
    app = example.make_app()

    @app.before_serving
    async def startup() -> None:
        served.lifespan.append("startup")

    @app.after_serving
    async def shutdown() -> None:
        stats = served.server.statistics()
        served.lifespan.append(
            f"shutdown: {stats.connections_open} connections open, "
            f"{stats.requests_running} requests running"
        )

    @app.before_request
    async def arrived() -> None:
        served.arrive(f"{request.method} {request.path}")

    @app.before_websocket
    async def ws_arrived() -> None:
        served.arrive(f"WebSocket {websocket.path}")

    @app.route("/hold")
    async def hold() -> str:
        await served.release.wait()
        return "held"

    @app.route("/stop-info")
    async def stop_info() -> dict[str, object]:
        await trio_graceful.asgi.wait_stop()
        return {
            "stop_requested": trio_graceful.asgi.stop_requested(),
            "left": trio_graceful.asgi.stop_deadline() - trio.current_time(),
        }

    @app.route("/thread")
    def in_a_thread() -> dict[str, object]:
        # A sync view: Quart-Trio runs it in a thread.
        flag = trio_graceful.asgi.current_stop_flag()
        return {"set": flag.wait(PATIENCE)}

    @app.route("/hang")
    async def hang() -> NoReturn:
        await trio.sleep_forever()

    @app.route("/drip")
    async def drip() -> Response:
        async def chunks() -> AsyncIterator[str]:
            while True:
                yield "tick\n"
                await trio.sleep(0.01)

        response = Response(chunks())
        response.timeout = None
        return response

    return app


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[Served]:
    served = Served()
    app = make_app(served)
    async with trio_graceful.open_bundle(name="test") as bundle:
        served.bundle = bundle
        _, inbox = bundle.open_inbox()
        served.server = await bundle.start(
            functools.partial(
                trio_graceful.asgi.serve_asgi, inbox, app, bind="127.0.0.1:0"
            )
        )
        assert served.lifespan == ["startup"]
        try:
            yield served
        finally:
            served.close_wires()
        if not bundle.cancelling:
            bundle.cancel_scope.cancel()


# -- at STOP ------------------------------------------------------------------


async def test_stop_closes_the_listener_and_idle_connections_at_once():
    async with serving() as served, trio.open_nursery() as nursery:
        idle = await served.wire()
        await idle.send("/work?ms=0")
        reply = await idle.response()
        assert (reply.status, reply.json()) == (200, {"worked_ms": 0})
        assert "connection" not in reply.headers  # kept alive
        busy = await served.wire()
        await busy.send("/hold")
        await served.wait_arrived("GET /hold")
        t0 = trio.current_time()
        info = await served.stop(nursery)
        # wait_stop() returned, stop_requested() says so, and the cut-off is
        # a second before the hard deadline.
        assert info.headers["connection"] == "close"
        assert info.json()["stop_requested"] is True
        assert PATIENCE - 1 - 5 < info.json()["left"] <= PATIENCE - 1
        await served.refused()
        # While a request still runs, the idle connection has its FIN.
        await idle.fin()
        assert served.server.running_requests() == ["GET /hold"]
        assert trio.current_time() - t0 < 5
        served.release.set()
        reply = await busy.response()
        assert (reply.status, reply.body) == (200, b"held")
        assert reply.headers["connection"] == "close"
        await busy.fin()
    served.assert_drained()


@pytest.mark.parametrize("where", ["in the server's buffers", "in the socket"])
async def test_requests_pipelined_before_stop_are_all_answered(where):
    async with serving() as served, trio.open_nursery() as nursery:
        wire = await served.wire()
        if where == "in the server's buffers":
            # One write: the server has read the two behind /hold with it.
            await wire.send("/hold", "/work?ms=1", "/work?ms=2")
            await served.wait_arrived("GET /hold")
        else:
            # With a request in its buffers behind /hold, the server reads no
            # more while /hold runs: the last one stays in the socket.
            await wire.send("/hold", "/work?ms=1")
            await served.wait_arrived("GET /hold")
            await wire.send("/work?ms=2")
        await served.stop(nursery)
        served.release.set()
        replies = await wire.replies()
    assert [(r.status, r.body, r.headers.get("connection")) for r in replies] == [
        (200, b"held", None),
        (200, b'{"worked_ms":1}\n', None),
        (200, b'{"worked_ms":2}\n', "close"),
    ]
    assert served.arrivals == ["GET /hold", "GET /stop-info", "GET /work", "GET /work"]
    served.assert_drained()


async def test_a_sync_view_in_a_thread_sees_its_stop_flag():
    async with (
        serving() as served,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as client,
        trio.open_nursery() as nursery,
    ):
        replies: list[httpx.Response] = []

        async def get() -> None:
            replies.append(await client.get("/thread"))

        nursery.start_soon(get)
        await served.wait_arrived("GET /thread")
        await served.stop(nursery)
    [reply] = replies
    assert (reply.status_code, reply.json()) == (200, {"set": True})
    assert reply.headers["connection"] == "close"
    served.assert_drained()


# -- streams and WebSockets hear STOP in band ---------------------------------------


async def test_an_sse_stream_sends_its_last_event_and_ends():
    url = "http://127.0.0.1:{}/events?ms=20"
    async with (
        serving() as served,
        trio.open_nursery() as nursery,
        httpx.AsyncClient() as client,
        client.stream("GET", url.format(served.port)) as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["transfer-encoding"] == "chunked"
        lines = response.aiter_lines()
        assert await anext(lines) == "data: 0"
        await served.stop(nursery)
        # httpx raises if the chunked body does not end properly.
        rest = [line async for line in lines]
    assert_ends_with_bye(rest)
    served.assert_drained()


def assert_ends_with_bye(rest: list[str]) -> None:
    """Check the lines of an SSE stream after ``data: 0``: then ``data: 1``
    and on, and last ``event: bye``, with the next number."""
    last = sum(line.startswith("data: ") for line in rest)
    assert rest == [
        "",
        *(line for i in range(1, last) for line in (f"data: {i}", "")),
        "event: bye",
        f"data: {last}",
        "",
    ]


async def test_a_websocket_closes_with_1001_and_waits_for_the_clients_close():
    async with (
        serving() as served,
        trio.open_nursery() as nursery,
        open_wire_client(served.port, target="/echo") as ws,
    ):
        await ws.send_text("hello")
        event = await ws.receive()
        assert isinstance(event, wsproto.events.TextMessage), event
        assert event.data == "hello"
        await served.stop(nursery)
        assert await ws.receive_close() == SHUTTING_DOWN
        # The server has done all it would do without the client's CLOSE:
        # the handler waits, the connection is open, the lifespan waits.
        await trio.testing.wait_all_tasks_blocked()
        assert served.server.running_requests() == ["WebSocket /echo"]
        assert served.server.statistics().connections_open == 1
        assert served.lifespan == ["startup"]
        await ws.send_close(1001)
        assert await ws.stream.receive_some() == b""
        assert_fin_not_reset(ws.stream)
    served.assert_drained()


Close = tuple[int, str]


def echo_then_wait_for_close(
    url: str, echoed: Callable[[], object]
) -> tuple[Close, Close]:
    """With the `websockets` client: echo a message, call ``echoed()``, then
    return the CLOSE frames received and sent, once the connection has closed.
    """
    with websockets_connect(url, open_timeout=PATIENCE) as ws:
        ws.send("hello")
        assert ws.recv(timeout=PATIENCE) == "hello"
        echoed()
        with pytest.raises(ConnectionClosedOK) as closed:
            ws.recv(timeout=PATIENCE)
    rcvd, sent = closed.value.rcvd, closed.value.sent
    assert rcvd is not None
    assert sent is not None
    return (rcvd.code, rcvd.reason), (sent.code, sent.reason)


async def test_the_websockets_library_client_hears_1001_and_answers_it():
    async with serving() as served, trio.open_nursery() as nursery:

        def stop() -> None:
            trio.from_thread.run_sync(nursery.start_soon, served.shutdown, PATIENCE)

        url = f"ws://127.0.0.1:{served.port}/echo"
        rcvd, sent = await trio.to_thread.run_sync(echo_then_wait_for_close, url, stop)
    assert rcvd == SHUTTING_DOWN
    assert sent == SHUTTING_DOWN  # the client echoes the code and reason
    served.assert_drained()


# -- at the cut-off ---------------------------------------------------------------


async def test_at_the_cut_off_a_request_not_answered_yet_gets_a_503():
    async with serving() as served, trio.open_nursery() as nursery:
        wire = await served.wire()
        await wire.send("/hang")
        await served.wait_arrived("GET /hang")
        t0 = trio.current_time()
        info = await served.stop(nursery, grace=1)
        # The cut-off: the last tenth of a 1 s grace is kept.
        assert 0 < info.json()["left"] <= 0.9
        reply = await wire.response()
        assert trio.current_time() - t0 > 0.8
        await wire.fin()
    assert reply == Reply(
        503,
        {
            "content-length": "0",
            "connection": "close",
            "retry-after": "1",
            "date": reply.headers["date"],
            "server": "hypercorn-h11",
        },
        b"",
    )
    assert served.server.statistics().requests_cut_off == 1
    served.assert_drained()


async def test_at_the_cut_off_requests_pipelined_behind_get_a_503_too():
    # AsgiServerStatistics.requests_cut_off: "answered 503 without running,
    # if pipelined behind one".
    async with serving() as served, trio.open_nursery() as nursery:
        wire = await served.wire()
        await wire.send("/hang", "/work?ms=1")
        await served.wait_arrived("GET /hang")
        await served.stop(nursery, grace=1)
        replies = await wire.replies()
    assert [reply.status for reply in replies] == [503, 503]
    assert replies[-1].headers["connection"] == "close"
    assert served.arrivals == ["GET /hang", "GET /stop-info"]
    served.assert_drained()


async def test_at_the_cut_off_a_request_left_in_the_socket_does_not_cause_a_reset():
    async with serving() as served:
        wire = await served.wire()
        async with trio.open_nursery() as nursery:
            # The server reads /hang and /work?ms=1, then no more while
            # /hang runs: /work?ms=2 stays in the socket.
            await wire.send("/hang", "/work?ms=1")
            await served.wait_arrived("GET /hang")
            await wire.send("/work?ms=2")
            await served.stop(nursery, grace=1)
        # The server has ended: it has closed every socket. The client reads
        # only now, as a slow one would.
        replies = await wire.replies()
    assert replies[0].status == 503
    assert replies[-1].headers["connection"] == "close"
    served.assert_drained()


async def test_at_the_cut_off_a_stream_ends_with_its_terminating_chunk():
    async with serving() as served, trio.open_nursery() as nursery:
        wire = await served.wire()
        await wire.send("/drip")
        head = await wire.head()
        assert (head.status_code, dict(head.headers)[b"transfer-encoding"]) == (
            200,
            b"chunked",
        )
        await served.stop(nursery, grace=1)
        body = await wire.body()
        await wire.fin()
    assert body.startswith(b"tick\n")
    assert body == b"tick\n" * (len(body) // 5)
    assert wire.raw.endswith(b"5\r\ntick\n\r\n0\r\n\r\n")
    assert served.server.statistics().requests_cut_off == 1
    served.assert_drained()


# -- the example, as users run it -----------------------------------------------------


async def _through_sigterm(
    port: int, process: subprocess.Popen[bytes]
) -> tuple[list[str], tuple[Close, Close]]:
    """Open an SSE stream and a WebSocket, send SIGTERM, and see them end."""
    echoed = trio.Event()
    closes: list[tuple[Close, Close]] = []

    async def ws_client() -> None:
        def ready() -> None:
            trio.from_thread.run_sync(echoed.set)

        url = f"ws://127.0.0.1:{port}/echo"
        closes.append(
            await trio.to_thread.run_sync(echo_then_wait_for_close, url, ready)
        )

    url = f"http://127.0.0.1:{port}/events?ms=50"
    async with (
        trio.open_nursery() as nursery,
        httpx.AsyncClient() as client,
        client.stream("GET", url) as response,
    ):
        nursery.start_soon(ws_client)
        lines = response.aiter_lines()
        assert await anext(lines) == "data: 0"
        await echoed.wait()
        process.send_signal(signal.SIGTERM)
        rest = [line async for line in lines]
    return rest, closes[0]


def test_sigterm_ends_the_examples_stream_and_websocket_then_exits_0():
    argv = [sys.executable, str(EXAMPLES / "quart_service.py"), "--port", "0"]
    with running(argv) as process:
        assert process.stderr is not None
        errors = LineReader(process.stderr)
        port = int(errors.until("quart_service: listening on ").rsplit(":", 1)[1])
        rest, (rcvd, sent) = trio.run(_through_sigterm, port, process)
        lines = errors.rest()
        assert process.wait(PATIENCE) == 0
    assert_ends_with_bye(rest)
    assert rcvd == sent == SHUTTING_DOWN
    assert not [line for line in errors.seen if "Traceback" in line]
    assert lines[0] == "trio_graceful.runner: SIGTERM: shutting down (grace 10 s)"
    draining = [line for line in lines if "STOP: draining" in line]
    assert draining == [
        "trio_graceful.asgi: STOP: draining 2 connections, 2 requests running; "
        "cut-off in 9.0 s"
    ]
    # The lifespan's shutdown comes after the drain.
    assert lines.index("quart_service: shutdown") > lines.index(draining[0])
