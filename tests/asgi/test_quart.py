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
import json
import logging
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import attrs
import httpx
import hypercorn.config
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
from tests.support.asgi_server import Answer, RawClient, Served, serving
from tests.support.examples import EXAMPLES, load_example
from tests.support.processes import PATIENCE, LineReader, running
from tests.support.websocket_clients import open_wire_client

pytestmark = pytest.mark.realtime

example = load_example("quart_service")

# Linux's TCP state once a FIN has come in; a reset leaves it CLOSE (7).
CLOSE_WAIT = 8
SHUTTING_DOWN = (1001, "the server is shutting down")
# What the lifespan saw: its shutdown came after the last connection.
LIFESPAN = ["startup", "shutdown: 0 connections open, 0 requests running"]


def answers_until_close(answers: list[Answer]) -> list[tuple[int, bytes, bool]]:
    return [(a.status, a.body, a.closes) for a in answers]


async def read_to_the_end(client: RawClient) -> list[Answer]:
    """Read responses until one says ``Connection: close``, then check that
    the server closed with a FIN and sent no reset."""
    answers = [await client.answer()]
    while not answers[-1].closes:
        answers.append(await client.answer())
    await assert_fin_not_reset(client)
    return answers


async def assert_fin_not_reset(client: RawClient) -> None:
    """Check that the server closed with a FIN, nothing after it, and no
    reset; then close the client's side too.

    A reset that follows the FIN does not show as an error when reading on
    Linux (end of file wins); the TCP state does show it.
    """
    assert await client.end() == "eof"
    assert client.extra == b""
    assert isinstance(client.stream, trio.SocketStream)
    tcp_info = client.stream.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)
    assert tcp_info[0] == CLOSE_WAIT, f"TCP state {tcp_info[0]}: a reset came"
    await client.aclose()


# -- the app and its server --------------------------------------------------------


@attrs.define(eq=False)
class Running:
    """The test app's server, and what its app recorded."""

    arrivals: list[str] = attrs.field(factory=list)
    lifespan: list[str] = attrs.field(factory=list)
    release: trio.Event = attrs.field(factory=trio.Event)
    _arrived: trio.Event = attrs.field(factory=trio.Event)
    served: Served = attrs.field(init=False)

    @property
    def server(self) -> trio_graceful.asgi.AsgiServer:
        return self.served.server

    @property
    def port(self) -> int:
        return self.server.addresses[0][1]

    async def connect(self) -> RawClient:
        return await self.served.connect()

    def arrive(self, what: str) -> None:
        self.arrivals.append(what)
        self._arrived.set()
        self._arrived = trio.Event()

    async def wait_arrived(self, *what: str) -> None:
        """Wait until the app has begun the requests ``what`` (``GET /path``)."""
        while not set(what) <= set(self.arrivals):
            await self._arrived.wait()

    async def stop(self, nursery: trio.Nursery, grace: float = PATIENCE) -> Any:
        """Begin the shutdown, and return once the app has heard STOP.

        The app's word for it is its answer to ``/stop-info``, asked before;
        that answer is returned.
        """
        client = await self.connect()
        await client.send("/stop-info")
        await self.wait_arrived("GET /stop-info")
        nursery.start_soon(self.served.shutdown, grace)
        [answer] = await read_to_the_end(client)
        return json.loads(answer.body)

    async def cut_off_soon(
        self, nursery: trio.Nursery, *targets: str
    ) -> tuple[RawClient, Any]:
        """Send ``targets`` pipelined, wait until the first has begun, then
        STOP with a 1 s grace; return the client and the answer of `stop`."""
        client = await self.connect()
        await client.send(*targets)
        await self.wait_arrived("GET " + targets[0].split("?")[0])
        return client, await self.stop(nursery, grace=1)

    def assert_drained(self) -> None:
        """Check that the server ended in its grace, the lifespan last."""
        assert self.served.report is not None
        assert self.served.report.graceful
        assert self.lifespan == LIFESPAN

    async def refused(self) -> None:
        """Check that a new connection is refused: the listener is closed."""
        with pytest.raises(OSError, match=r"^all attempts to connect to .* failed$"):
            await trio.open_tcp_stream("127.0.0.1", self.port)


def make_app(served: Running) -> QuartTrio:
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
            "stop_received": trio_graceful.asgi.stop_received(),
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
async def running_app() -> AsyncIterator[Running]:
    running = Running()
    async with serving(make_app(running)) as served:
        running.served = served
        assert running.lifespan == ["startup"]
        yield running


# -- at STOP ------------------------------------------------------------------


async def test_stop_closes_the_listener_and_idle_connections_at_once():
    async with running_app() as running, trio.open_nursery() as nursery:
        idle = await running.connect()
        await idle.send("/work?ms=0")
        answer = await idle.answer()
        assert (answer.status, answer.body, answer.closes) == (
            200,
            b'{"worked_ms":0}\n',
            False,
        )
        busy = await running.connect()
        await busy.send("/hold")
        await running.wait_arrived("GET /hold")
        t0 = trio.current_time()
        info = await running.stop(nursery)
        # wait_stop() returned, stop_received() says so, and the cut-off is
        # a second before the hard deadline.
        assert info["stop_received"] is True
        assert PATIENCE - 1 - 5 < info["left"] <= PATIENCE - 1
        await running.refused()
        # While a request still runs, the idle connection has its FIN.
        await assert_fin_not_reset(idle)
        assert running.server.running_requests() == ["GET /hold"]
        assert trio.current_time() - t0 < 5
        running.release.set()
        answers = await read_to_the_end(busy)
    assert answers_until_close(answers) == [(200, b"held", True)]
    running.assert_drained()


@pytest.mark.parametrize("where", ["in the server's buffers", "in the socket"])
async def test_requests_pipelined_before_stop_are_all_answered(where):
    async with running_app() as running, trio.open_nursery() as nursery:
        client = await running.connect()
        if where == "in the server's buffers":
            # One write: the server has read the two behind /hold with it.
            await client.send("/hold", "/work?ms=1", "/work?ms=2")
            await running.wait_arrived("GET /hold")
        else:
            # With a request in its buffers behind /hold, the server reads no
            # more while /hold runs: the last one stays in the socket.
            await client.send("/hold", "/work?ms=1")
            await running.wait_arrived("GET /hold")
            await client.send("/work?ms=2")
        await running.stop(nursery)
        running.release.set()
        answers = await read_to_the_end(client)
    assert answers_until_close(answers) == [
        (200, b"held", False),
        (200, b'{"worked_ms":1}\n', False),
        (200, b'{"worked_ms":2}\n', True),
    ]
    assert running.arrivals == ["GET /hold", "GET /stop-info", "GET /work", "GET /work"]
    running.assert_drained()


async def test_a_sync_view_in_a_thread_sees_its_stop_flag():
    async with (
        running_app() as running,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{running.port}") as client,
        trio.open_nursery() as nursery,
    ):
        replies: list[httpx.Response] = []

        async def get() -> None:
            replies.append(await client.get("/thread"))

        nursery.start_soon(get)
        await running.wait_arrived("GET /thread")
        await running.stop(nursery)
    [reply] = replies
    assert (reply.status_code, reply.json()) == (200, {"set": True})
    assert reply.headers["connection"] == "close"
    running.assert_drained()


# -- streams and WebSockets hear STOP in band ---------------------------------------


async def test_an_sse_stream_sends_its_last_event_and_ends():
    async with (
        running_app() as running,
        trio.open_nursery() as nursery,
        httpx.AsyncClient() as client,
        client.stream("GET", f"http://127.0.0.1:{running.port}/events?ms=20") as sse,
    ):
        assert sse.headers["content-type"].startswith("text/event-stream")
        assert sse.headers["transfer-encoding"] == "chunked"
        lines = sse.aiter_lines()
        assert await anext(lines) == "data: 0"
        await running.stop(nursery)
        # httpx raises if the chunked body does not end properly.
        rest = [line async for line in lines]
    assert_ends_with_bye(rest)
    running.assert_drained()


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
        running_app() as running,
        trio.open_nursery() as nursery,
        open_wire_client(running.port, target="/echo") as ws,
    ):
        await ws.send_text("hello")
        event = await ws.receive()
        assert isinstance(event, wsproto.events.TextMessage), event
        assert event.data == "hello"
        await running.stop(nursery)
        assert await ws.receive_close() == SHUTTING_DOWN
        # The server has done all it would do without the client's CLOSE:
        # the handler waits, the connection is open, the lifespan waits.
        await trio.testing.wait_all_tasks_blocked()
        assert running.server.running_requests() == ["WebSocket /echo"]
        assert running.server.statistics().connections_open == 1
        assert running.lifespan == ["startup"]
        await ws.send_close(1001)
        await assert_fin_not_reset(RawClient(ws.stream))
    running.assert_drained()


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
    async with running_app() as running, trio.open_nursery() as nursery:

        def stop() -> None:
            trio.from_thread.run_sync(
                nursery.start_soon, running.served.shutdown, PATIENCE
            )

        url = f"ws://127.0.0.1:{running.port}/echo"
        rcvd, sent = await trio.to_thread.run_sync(echo_then_wait_for_close, url, stop)
    assert rcvd == SHUTTING_DOWN
    assert sent == SHUTTING_DOWN  # the client echoes the code and reason
    running.assert_drained()


# -- at the cut-off ---------------------------------------------------------------


async def test_at_the_cut_off_a_request_not_answered_yet_gets_a_503():
    async with running_app() as running, trio.open_nursery() as nursery:
        t0 = trio.current_time()
        client, info = await running.cut_off_soon(nursery, "/hang")
        # The cut-off: the last tenth of a 1 s grace is kept.
        assert 0 < info["left"] <= 0.9
        [answer] = await read_to_the_end(client)
        assert trio.current_time() - t0 > 0.8
    assert (answer.status, answer.body, answer.closes) == (503, b"", True)
    assert answer.headers[b"retry-after"] == b"1"
    assert running.server.statistics().requests_cut_off == 1
    running.assert_drained()


async def test_at_the_cut_off_requests_pipelined_behind_get_a_503_too():
    # AsgiServerStatistics.requests_cut_off: "answered 503 without running,
    # if pipelined behind one".
    async with running_app() as running, trio.open_nursery() as nursery:
        client, _ = await running.cut_off_soon(nursery, "/hang", "/work?ms=1")
        answers = await read_to_the_end(client)
    assert [answer.status for answer in answers] == [503, 503]
    assert running.arrivals == ["GET /hang", "GET /stop-info"]
    running.assert_drained()


async def test_at_the_cut_off_a_request_left_in_the_socket_does_not_cause_a_reset():
    async with running_app() as running:
        client = await running.connect()
        async with trio.open_nursery() as nursery:
            # The server reads /hang and /work?ms=1, then no more while
            # /hang runs: /work?ms=2 stays in the socket.
            await client.send("/hang", "/work?ms=1")
            await running.wait_arrived("GET /hang")
            await client.send("/work?ms=2")
            await running.stop(nursery, grace=1)
        # The server has ended: it has closed every socket. The client reads
        # only now, as a slow one would.
        answers = await read_to_the_end(client)
    assert answers[0].status == 503
    running.assert_drained()


async def test_at_the_cut_off_a_stream_ends_with_its_terminating_chunk():
    async with running_app() as running, trio.open_nursery() as nursery:
        client, _ = await running.cut_off_soon(nursery, "/drip")
        answer = await client.answer()
        await assert_fin_not_reset(client)
    # Started before STOP, it could not say "Connection: close"; it ended
    # properly, and the connection closed after it.
    assert (answer.status, answer.chunked, answer.closes) == (200, True, False)
    assert answer.body.startswith(b"tick\n")
    assert answer.body == b"tick\n" * (len(answer.body) // 5)
    assert client.raw.endswith(b"5\r\ntick\n\r\n0\r\n\r\n")
    assert running.server.statistics().requests_cut_off == 1
    running.assert_drained()


# -- a client that closes as soon as it has its answer ------------------------------


async def test_a_client_closing_right_after_its_answer_raises_nothing_in_the_app(
    caplog,
):
    # The race: the response has ended and the server has decided to keep
    # the connection (both sides DONE), and before it starts the next cycle
    # it hands the app its http.disconnect; the client's FIN is read then.
    # With no room in the app's queue, that hand-over waits until the app
    # reads, which the test holds back until the FIN has been read.
    config = hypercorn.config.Config()
    config.max_app_queue_size = 0
    held = trio.Event()
    release = trio.Event()
    running = Running()
    quart_app = make_app(running)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        received = []

        async def held_receive() -> Any:
            if received and received[-1]["type"] == "http.request":
                held.set()
                await release.wait()
            received.append(await receive())
            return received[-1]

        await quart_app(scope, held_receive, send)

    async with serving(app, config=config) as served:
        running.served = served
        client = await served.connect()
        await client.send("/work?ms=0")
        answer = await client.answer()
        assert answer.status == 200
        await held.wait()
        await client.stream.send_eof()
        await trio.testing.wait_all_tasks_blocked()
        release.set()
        assert await client.end() == "eof"
        await served.shutdown(PATIENCE)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
    running.assert_drained()


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
