"""The health endpoint: real HTTP over loopback, and timing on memory streams."""

from __future__ import annotations

import contextlib
import errno
import functools
import http.client
import json
import logging
import math
import socket
from collections.abc import AsyncGenerator, Callable
from contextlib import asynccontextmanager

import attrs
import h11
import pytest
import trio
import trio.testing

import trio_graceful
from trio_graceful._deploy._health import (
    REPORT_INTERVAL,
    HealthAnswer,
    HealthEndpoint,
    HealthStatistics,
)
from trio_graceful._deploy._healthserve import open_health_listeners, serve_health

TEXT = "text/plain; charset=utf-8"


@attrs.define
class Switchboard:
    """The test double for ``answer``: what the program says, flipped by a test."""

    live: bool = True
    ready: bool = True
    reason: str = ""
    status: dict[str, object] = attrs.field(factory=lambda: {"state": "ready"})
    calls: int = 0
    on_call: Callable[[], object] | None = None

    def __call__(self) -> HealthAnswer:
        self.calls += 1
        if self.on_call is not None:
            self.on_call()
        return HealthAnswer(self.live, self.ready, self.status, self.reason)


class MemoryListener(trio.abc.Listener[trio.abc.Stream]):
    """A listener whose connections are in-memory stream pairs."""

    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[trio.abc.Stream](1000)
        self.closed = False

    async def connect(self, *, lockstep: bool = False) -> Client:
        """Connect a client; ``lockstep`` makes each send wait for its reader."""
        pair = trio.testing.lockstep_stream_pair
        client, server = (pair if lockstep else trio.testing.memory_stream_pair)()
        await self.offer(server)
        return Client(client)

    async def offer(self, server: trio.abc.Stream) -> None:
        """Have ``server`` accepted as the server's side of a connection."""
        await self._send.send(server)

    async def accept(self) -> trio.abc.Stream:
        return await self._receive.receive()

    async def aclose(self) -> None:
        self.closed = True
        await self._receive.aclose()


@attrs.define
class Served:
    endpoint: HealthEndpoint
    sender: trio_graceful.InboxSender[object]
    done: trio.Event

    async def stop(self) -> None:
        self.sender.stop()
        await self.done.wait()


@asynccontextmanager
async def serving(
    listeners: list[trio.abc.Listener[trio.abc.Stream]],
    answer: Callable[[], HealthAnswer],
    **options: object,
) -> AsyncGenerator[Served, None]:
    sender, inbox = trio_graceful.open_inbox[object]()
    done = trio.Event()

    async def run(*, task_status: trio.TaskStatus[HealthEndpoint]) -> None:
        try:
            await serve_health(
                inbox,
                listeners,
                answer,
                task_status=task_status,
                **options,  # type: ignore[arg-type]
            )
        finally:
            done.set()

    async with trio.open_nursery() as nursery:
        endpoint = await nursery.start(run)
        served = Served(endpoint, sender, done)
        yield served
        await served.stop()


@asynccontextmanager
async def on_loopback(
    answer: Callable[[], HealthAnswer], **options: object
) -> AsyncGenerator[tuple[Served, int], None]:
    listeners = await open_health_listeners("127.0.0.1", 0)
    port = listeners[0].socket.getsockname()[1]
    async with serving(list(listeners), answer, **options) as served:
        yield served, port


@attrs.frozen
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


def fetch(
    port: int,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> Reply:
    """One request with http.client on a new connection (run it in a thread)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return Reply(response.status, dict(response.getheaders()), response.read())
    finally:
        connection.close()


async def fetch_in_thread(port: int, method: str, path: str, **kw: object) -> Reply:
    return await trio.to_thread.run_sync(
        functools.partial(fetch, port, method, path, **kw)  # type: ignore[arg-type]
    )


async def connection_refused(port: int) -> bool:
    with trio.socket.socket() as sock:
        try:
            await sock.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return True
    return False


class Client:
    """An HTTP/1.1 client on h11 over any Trio stream, for exact control.

    Requests may be written before earlier answers are read (pipelining);
    `response` reads the answers in order.
    """

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.http = h11.Connection(h11.CLIENT)
        self.pending: list[bytes] = []  # the methods of requests not answered yet

    def request(
        self, method: bytes, target: bytes, *headers: tuple[bytes, bytes]
    ) -> bytes:
        """Return a request's bytes, and expect its answer."""
        request = h11.Request(
            method=method, target=target, headers=[(b"host", b"x"), *headers]
        )
        self.pending.append(method)
        writer = h11.Connection(h11.CLIENT)
        return (writer.send(request) or b"") + (writer.send(h11.EndOfMessage()) or b"")

    async def get(
        self, target: bytes, method: bytes = b"GET", *headers: tuple[bytes, bytes]
    ) -> Reply:
        await self.stream.send_all(self.request(method, target, *headers))
        return await self.response()

    async def response(self) -> Reply:
        """Read the answer to the oldest request not answered yet."""
        if self.http.states == {h11.CLIENT: h11.DONE, h11.SERVER: h11.DONE}:
            self.http.start_next_cycle()
        # Our h11 only needs the method to read the answer: the request went
        # out as bytes (or as garbage from the test itself).
        method = self.pending.pop(0) if self.pending else b"GET"
        self.http.send(
            h11.Request(method=method, target=b"/", headers=[(b"host", b"x")])
        )
        self.http.send(h11.EndOfMessage())
        response: h11.Response | None = None
        body = b""
        while True:
            event = self.http.next_event()
            if event is h11.NEED_DATA:
                self.http.receive_data(bytes(await self.stream.receive_some()))
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert response is not None
                headers = {k.decode(): v.decode() for k, v in response.headers}
                return Reply(response.status_code, headers, body)
            else:
                raise AssertionError(f"unexpected {event!r}")

    async def closed_by_server(self) -> bool:
        """True if the server closed, once what it sent has been read."""
        leftover, _ = self.http.trailing_data
        return not leftover and await self.stream.receive_some() == b""


def text_reply(status: int, body: str, **extra: str) -> Reply:
    headers = {
        "content-type": TEXT,
        "content-length": str(len(body) + 1),
        "cache-control": "no-store",
        **extra,
    }
    return Reply(status, headers, (body + "\n").encode())


def lower(reply: Reply) -> Reply:
    """http.client keeps the header names' case; compare them in lower case."""
    return Reply(
        reply.status, {k.lower(): v for k, v in reply.headers.items()}, reply.body
    )


# ---------------------------------------------------------------- real HTTP


@pytest.mark.parametrize(
    ("path", "state", "expected"),
    [
        ("/livez", {}, text_reply(200, "live")),
        ("/livez", {"live": False}, text_reply(503, "not live")),
        ("/readyz", {}, text_reply(200, "ready")),
        ("/readyz", {"ready": False}, text_reply(503, "not ready")),
        (
            "/readyz",
            {"ready": False, "reason": "draining"},
            text_reply(503, "not ready: draining"),
        ),
        ("/readyz?verbose", {}, text_reply(200, "ready")),
        ("/livez?x=1&y", {"live": False}, text_reply(503, "not live")),
        ("/nothing", {}, text_reply(404, "not found")),
        ("/", {}, text_reply(404, "not found")),
        ("/livez/", {}, text_reply(404, "not found")),
    ],
)
async def test_each_path_and_state_over_http(
    path: str, state: dict[str, object], expected: Reply
) -> None:
    switchboard = Switchboard(**state)  # type: ignore[arg-type]
    async with on_loopback(switchboard) as (_, port):
        reply = await fetch_in_thread(port, "GET", path)
    assert lower(reply) == expected


async def test_statusz_serves_the_status_as_sorted_json() -> None:
    status: dict[str, object] = {"state": "withdrawn", "b": [1, 2], "a": None}
    switchboard = Switchboard(ready=False, status=status)
    async with on_loopback(switchboard) as (_, port):
        reply = lower(await fetch_in_thread(port, "GET", "/statusz?pretty"))
    body = b'{"a": null, "b": [1, 2], "state": "withdrawn"}'
    assert reply == Reply(
        200,
        {
            "content-type": "application/json",
            "content-length": str(len(body)),
            "cache-control": "no-store",
        },
        body,
    )
    assert json.loads(reply.body) == status


@pytest.mark.parametrize("path", ["/livez", "/readyz", "/statusz", "/nope"])
async def test_head_has_the_headers_of_get_and_no_body(path: str) -> None:
    switchboard = Switchboard(ready=False, reason="starting")
    async with on_loopback(switchboard) as (_, port):
        get = lower(await fetch_in_thread(port, "GET", path))
        head = lower(await fetch_in_thread(port, "HEAD", path))
    assert get.body
    assert head == Reply(get.status, get.headers, b"")


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS", "PATCH"])
async def test_other_methods_get_405_with_allow(method: str) -> None:
    switchboard = Switchboard()
    async with on_loopback(switchboard) as (_, port):
        reply = await fetch_in_thread(port, method, "/readyz", body=b"ignored")
    assert lower(reply) == text_reply(405, "method not allowed", allow="GET, HEAD")
    assert switchboard.calls == 0  # nothing to ask for a refused method


async def test_keep_alive_answers_each_request_with_the_state_of_its_time() -> None:
    switchboard = Switchboard()

    def two_requests() -> tuple[Reply, Reply, bool]:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            connection.request("GET", "/readyz")
            response = connection.getresponse()
            first = Reply(response.status, {}, response.read())
            sock = connection.sock
            switchboard.ready, switchboard.reason = False, "withdrawn"
            connection.request("GET", "/readyz")
            response = connection.getresponse()
            second = Reply(response.status, {}, response.read())
            return first, second, connection.sock is sock
        finally:
            connection.close()

    async with on_loopback(switchboard) as (served, port):
        first, second, same_socket = await trio.to_thread.run_sync(two_requests)
        assert served.endpoint.statistics().answered == 2
    assert first == Reply(200, {}, b"ready\n")
    assert second == Reply(503, {}, b"not ready: withdrawn\n")
    assert same_socket
    assert switchboard.calls == 2


async def test_a_body_is_read_and_dropped_and_the_connection_kept() -> None:
    async with on_loopback(Switchboard()) as (_, port):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            client = Client(stream)
            body = b"x" * 100_000
            head = h11.Request(
                method=b"POST",
                target=b"/livez",
                headers=[(b"host", b"x"), (b"content-length", b"%d" % len(body))],
            )
            writer = h11.Connection(h11.CLIENT)
            client.pending.append(b"POST")
            data = (writer.send(head) or b"") + (writer.send(h11.Data(body)) or b"")
            await stream.send_all(data + (writer.send(h11.EndOfMessage()) or b""))
            assert (await client.response()).status == 405
            assert (await client.get(b"/livez")).status == 200


async def test_connection_close_is_honoured() -> None:
    async with on_loopback(Switchboard()) as (served, port):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            client = Client(stream)
            reply = await client.get(b"/livez", b"GET", (b"connection", b"close"))
            assert reply.headers["connection"] == "close"
            assert await client.closed_by_server()
        await trio.testing.wait_all_tasks_blocked()
        assert served.endpoint.statistics().connections == 0


async def test_http_1_0_without_keep_alive_is_closed_after_its_answer() -> None:
    async with on_loopback(Switchboard()) as (_, port):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"GET /livez HTTP/1.0\r\n\r\n")
            received = b""
            while data := await stream.receive_some():
                received += data
    assert received.startswith(b"HTTP/1.1 200 OK\r\n")
    assert received.endswith(b"\r\n\r\nlive\n")


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" * 10 + b"\r\n\r\n",  # TLS
        b"GET /livez HTTP/1.1\r\nno colon here\r\n\r\n",
        b"GET /livez HTTP/1.1\r\n\r\n",  # HTTP/1.1 demands a Host header
        b"GET\r\n\r\n",
    ],
)
async def test_garbage_gets_400_then_the_connection_closes(garbage: bytes) -> None:
    async with on_loopback(Switchboard()) as (served, port):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            client = Client(stream)
            await stream.send_all(garbage)
            reply = await client.response()
            assert await client.closed_by_server()
        assert reply == text_reply(400, "bad request", connection="close")
        # The endpoint still serves.
        assert (await fetch_in_thread(port, "GET", "/livez")).status == 200
        assert served.endpoint.statistics().answered == 2


async def test_a_head_too_large_gets_431() -> None:
    async with on_loopback(Switchboard(), max_header_bytes=1024) as (_, port):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            client = Client(stream)
            # A head that never ends: h11 refuses to hold more than the cap.
            await stream.send_all(b"GET /livez HTTP/1.1\r\nx: " + b"y" * 2000)
            reply = await client.response()
            assert await client.closed_by_server()
        assert reply == text_reply(
            431, "request header fields too large", connection="close"
        )
        # Under the limit is fine.
        reply = await fetch_in_thread(port, "GET", "/livez", headers={"x": "y" * 900})
        assert reply.status == 200


async def test_an_answer_that_raises_gets_500_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken() -> None:
        raise RuntimeError("no status today")

    switchboard = Switchboard(on_call=broken)
    async with on_loopback(switchboard) as (_, port):
        reply = await fetch_in_thread(port, "GET", "/readyz")
        switchboard.on_call = None
        assert (await fetch_in_thread(port, "GET", "/readyz")).status == 200
    assert lower(reply) == text_reply(500, "internal server error")
    [record] = [r for r in caplog.records if r.name == "trio_graceful.health"]
    assert record.levelno == logging.ERROR
    assert record.getMessage() == "health endpoint: no answer for GET /readyz"
    assert record.exc_info is not None
    assert str(record.exc_info[1]) == "no status today"


@pytest.mark.parametrize("value", [object(), math.inf, math.nan])
async def test_a_status_that_is_not_json_gets_500(value: object) -> None:
    switchboard = Switchboard(status={"when": value})
    async with on_loopback(switchboard) as (_, port):
        assert (await fetch_in_thread(port, "GET", "/statusz")).status == 500
        assert (await fetch_in_thread(port, "GET", "/livez")).status == 200


async def test_pipelined_requests_are_answered_in_order() -> None:
    switchboard = Switchboard(ready=False, reason="starting")
    async with on_loopback(switchboard) as (_, port):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            client = Client(stream)
            await stream.send_all(
                client.request(b"GET", b"/readyz")
                + client.request(b"HEAD", b"/livez")
                + client.request(b"GET", b"/livez", (b"connection", b"close"))
            )
            replies = [await client.response() for _ in range(3)]
            assert await client.closed_by_server()
    assert replies == [
        text_reply(503, "not ready: starting"),
        Reply(200, text_reply(200, "live").headers, b""),
        text_reply(200, "live", connection="close"),
    ]


# ---------------------------------------------------------------- listeners


async def test_open_health_listeners_on_a_free_port() -> None:
    listeners = await open_health_listeners("127.0.0.1", 0)
    try:
        [listener] = listeners
        host, port = listener.socket.getsockname()
        assert host == "127.0.0.1"
        assert port > 0
    finally:
        for listener in listeners:
            await listener.aclose()


async def test_open_health_listeners_on_every_interface() -> None:
    listeners = await open_health_listeners(None, 0)
    try:
        assert listeners
        hosts = {listener.socket.getsockname()[0] for listener in listeners}
        assert hosts <= {"0.0.0.0", "::"}
    finally:
        for listener in listeners:
            await listener.aclose()


async def test_a_port_in_use_is_an_error_naming_host_and_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=r"Address already in use") as info:
            await open_health_listeners("127.0.0.1", port)
    assert info.value.errno == errno.EADDRINUSE
    assert str(info.value) == (
        f"[Errno {errno.EADDRINUSE}] the health endpoint cannot listen on "
        f"port {port} of 127.0.0.1: Address already in use"
    )


@pytest.mark.parametrize(
    ("port", "error", "message"),
    [
        (True, TypeError, "port must be a port number, not True"),
        ("8080", TypeError, "port must be a port number, not '8080'"),
        (8080.0, TypeError, "port must be a port number, not 8080.0"),
        (None, TypeError, "port must be a port number, not None"),
        (-1, ValueError, "port must be a port number in 0..65535, not -1"),
        (65536, ValueError, "port must be a port number in 0..65535, not 65536"),
    ],
)
async def test_a_bad_port_is_refused(
    port: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"^{message}$"):
        await open_health_listeners("127.0.0.1", port)  # type: ignore[arg-type]


async def test_a_bad_host_is_refused() -> None:
    with pytest.raises(TypeError, match=r"^host must be a string or None, not 1$"):
        await open_health_listeners(1, 0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"answer": 5}, TypeError, "answer must be a callable, not 5"),
        ({"idle_timeout": -1}, ValueError, "idle_timeout must be >= 0, not -1"),
        (
            {"idle_timeout": "10"},
            TypeError,
            "idle_timeout must be a number of seconds, not str '10'",
        ),
        ({"max_connections": 0}, ValueError, "max_connections must be >= 1, not 0"),
        (
            {"max_connections": True},
            TypeError,
            "max_connections must be an int, not True",
        ),
        (
            {"max_header_bytes": 1.5},
            TypeError,
            "max_header_bytes must be an int, not 1.5",
        ),
    ],
)
async def test_bad_options_are_refused_and_the_listeners_closed(
    options: dict[str, object], error: type[Exception], message: str
) -> None:
    listener = MemoryListener()
    sender, inbox = trio_graceful.open_inbox[object]()
    options.setdefault("answer", Switchboard())
    answer = options.pop("answer")
    with pytest.raises(error, match=f"^{message}$"):
        await serve_health(inbox, [listener], answer, **options)  # type: ignore[arg-type]
    assert listener.closed
    assert not sender.statistics().tasks_waiting_send


def test_only_serve_health_creates_an_endpoint() -> None:
    with pytest.raises(TypeError, match="has no public constructor"):
        HealthEndpoint()  # type: ignore[call-arg]


# ---------------------------------------------------------------- shutdown


async def test_stop_closes_the_listeners_at_once_and_ends_the_service() -> None:
    switchboard = Switchboard()
    async with on_loopback(switchboard) as (served, port):
        assert (await fetch_in_thread(port, "GET", "/livez")).status == 200
        await served.stop()
        assert await connection_refused(port)
    assert switchboard.calls == 1


async def test_a_request_answered_when_stop_comes_gets_its_answer() -> None:
    # Over real sockets: the answer itself asks the endpoint to stop.
    switchboard = Switchboard(ready=False, reason="shutting down")
    async with on_loopback(switchboard) as (served, port):
        switchboard.on_call = served.sender.stop
        reply = await fetch_in_thread(port, "GET", "/readyz")
        await served.done.wait()
        assert await connection_refused(port)
    assert reply.status == 503
    assert reply.body == b"not ready: shutting down\n"


async def test_stop_waits_for_an_answer_being_sent_and_marks_it_close() -> None:
    listener = MemoryListener()
    async with serving([listener], Switchboard()) as served:
        client = await listener.connect(lockstep=True)
        fast = await listener.connect()
        await fast.get(b"/livez")  # then idle, kept alive
        await client.stream.send_all(client.request(b"GET", b"/readyz"))
        await trio.testing.wait_all_tasks_blocked()  # answer stuck in send_all
        served.sender.stop()
        await trio.testing.wait_all_tasks_blocked()
        assert listener.closed
        assert await fast.closed_by_server()  # the idle one: closed at once
        assert not served.done.is_set()  # the busy one holds the service
        assert served.endpoint.statistics().connections == 1
        assert await client.response() == text_reply(200, "ready")
        assert await client.closed_by_server()
        await served.done.wait()


async def test_an_answer_sent_after_stop_says_connection_close(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Two pipelined requests: STOP comes while the first is answered; the
    # second, already received, is answered too, and says the end.
    listener = MemoryListener()
    async with serving([listener], Switchboard()) as served:
        client = await listener.connect(lockstep=True)
        await client.stream.send_all(
            client.request(b"GET", b"/livez") + client.request(b"GET", b"/readyz")
        )
        await trio.testing.wait_all_tasks_blocked()
        served.sender.stop()
        await trio.testing.wait_all_tasks_blocked()
        assert await client.response() == text_reply(200, "live")
        second = await client.response()
        assert second == text_reply(200, "ready", connection="close")
        answered = trio.current_time()
        assert await client.closed_by_server()
        # The client neither closes nor sends: the server waits a second for
        # it to read the answer, then closes anyway.
        await served.done.wait()
        assert trio.current_time() - answered == 1


async def test_stop_closes_a_connection_with_a_request_partly_received(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="trio_graceful.health")
    listener = MemoryListener()
    switchboard = Switchboard()
    async with serving([listener], switchboard) as served:
        client = await listener.connect()
        await client.stream.send_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n")
        await trio.testing.wait_all_tasks_blocked()
        await served.stop()
        assert await client.closed_by_server()
    assert switchboard.calls == 0
    assert [r.getMessage() for r in caplog.records] == [
        "health endpoint: stopped with a request partly received"
    ]


# ---------------------------------------------------------------- bounds


async def test_a_silent_client_is_closed_after_the_idle_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    listener = MemoryListener()
    async with serving([listener], Switchboard(), idle_timeout=10) as served:
        start = trio.current_time()
        client = await listener.connect()
        assert await client.closed_by_server()
        assert trio.current_time() - start == 10
        assert served.endpoint.statistics() == HealthStatistics(
            connections=0, answered=0, refused=0, timed_out=1
        )


async def test_the_idle_timeout_counts_from_the_previous_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    listener = MemoryListener()
    async with serving([listener], Switchboard(), idle_timeout=10) as _:
        client = await listener.connect()
        await trio.sleep(7)
        await client.get(b"/livez")
        answered = trio.current_time()
        await trio.sleep(9)
        await client.get(b"/livez")  # 9 s after: still open
        answered = trio.current_time()
        assert await client.closed_by_server()
        assert trio.current_time() - answered == 10


@asynccontextmanager
async def one_client(**options: object) -> AsyncGenerator[tuple[Served, Client], None]:
    """Serve on a memory listener with ``options``, and connect one client."""
    listener = MemoryListener()
    async with serving([listener], Switchboard(), **options) as served:
        yield served, await listener.connect()


async def trickle_until_closed(client: Client, *, pause: float) -> None:
    """Send a request a byte every ``pause`` seconds until the server closes."""

    async def trickle() -> None:
        for byte in b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n":
            await client.stream.send_all(bytes([byte]))
            await trio.sleep(pause)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trickle)
        assert await client.closed_by_server()
        nursery.cancel_scope.cancel()


async def test_a_trickling_client_gets_no_more_than_the_idle_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with one_client(idle_timeout=10, head_timeout=60) as (served, client):
        start = trio.current_time()
        await trickle_until_closed(client, pause=3)
        assert trio.current_time() - start == 10
        assert served.endpoint.statistics().timed_out == 1


async def test_a_head_gets_head_timeout_from_its_first_byte(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with one_client(idle_timeout=10, head_timeout=2) as (served, client):
        await trio.sleep(5)  # quiet: only idle_timeout counts
        first_byte = trio.current_time()
        await trickle_until_closed(client, pause=0.5)
        assert trio.current_time() - first_byte == 2
        assert served.endpoint.statistics() == HealthStatistics(
            connections=0, answered=0, refused=0, timed_out=0, slow_heads=1
        )


async def test_the_head_timeout_counts_again_for_each_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with one_client(idle_timeout=10, head_timeout=2) as (served, client):
        for _ in range(3):  # a head in two parts, 1.5 s apart: in time
            head = client.request(b"GET", b"/livez")
            await client.stream.send_all(head[:5])
            await trio.sleep(1.5)
            await client.stream.send_all(head[5:])
            assert (await client.response()).status == 200
        assert served.endpoint.statistics().slow_heads == 0


async def test_a_slow_pipelined_head_counts_from_the_previous_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with one_client(idle_timeout=10, head_timeout=2) as (served, client):
        second = client.request(b"GET", b"/readyz")
        await client.stream.send_all(client.request(b"GET", b"/livez") + second[:5])
        assert (await client.response()).status == 200
        answered = trio.current_time()
        assert await client.closed_by_server()
        assert trio.current_time() - answered == 2
        assert served.endpoint.statistics().slow_heads == 1


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "trio_graceful.health" and r.levelno == logging.WARNING
    ]


def report(
    cap: int, evicted: int, refused: int, all_evicted: int, all_refused: int
) -> str:
    connections = "connection" if evicted == 1 else "connections"
    ones = "one" if refused == 1 else "ones"
    return (
        f"health endpoint at max_connections={cap}: closed {evicted} {connections} "
        f"waiting for a request to admit new ones, refused {refused} new {ones} "
        f"({all_evicted} closed, {all_refused} refused in all)"
    )


async def test_at_the_cap_the_oldest_waiting_connection_is_evicted(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    listener = MemoryListener()
    options = {"max_connections": 3, "idle_timeout": 100, "head_timeout": 100}
    async with serving([listener], Switchboard(), **options) as served:
        kept_alive = await listener.connect()  # t=0, then a request at t=3
        idle = await listener.connect()  # t=0, no byte ever
        await trio.sleep(1)
        slowloris = await listener.connect()  # t=1, part of a head at t=2
        await trio.sleep(1)
        await slowloris.stream.send_all(b"GET /livez HT")
        await trio.sleep(1)
        assert (await kept_alive.get(b"/livez")).status == 200
        await trio.sleep(1)
        # The head in progress goes first, though idle is older: a real
        # client sends its head at once. Each newcomer completes a request
        # at t=4: it is kept alive too, but its wait began after kept_alive's.
        for victim in (slowloris, idle, kept_alive):
            newcomer = await listener.connect()
            assert await victim.closed_by_server()
            assert (await newcomer.get(b"/readyz")).status == 200
        assert served.endpoint.statistics() == HealthStatistics(
            connections=3, answered=4, refused=0, timed_out=0, evicted=3
        )
        assert trio.current_time() == 4
    assert warnings(caplog) == [report(3, 1, 0, 1, 0), report(3, 2, 0, 3, 0)]


async def test_a_request_being_answered_is_never_evicted(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    listener = MemoryListener()
    async with serving([listener], Switchboard(), max_connections=1) as served:
        # Lockstep: the answer waits in send_all until the client reads it.
        answering = await listener.connect(lockstep=True)
        await answering.stream.send_all(answering.request(b"GET", b"/livez"))
        await trio.testing.wait_all_tasks_blocked()
        newcomer = await listener.connect()
        assert await newcomer.closed_by_server()
        assert served.endpoint.statistics() == HealthStatistics(
            connections=1, answered=0, refused=1, timed_out=0
        )
        assert (await answering.response()).status == 200
        await trio.testing.wait_all_tasks_blocked()
        # Answered and waiting for the next request, it can be evicted.
        later = await listener.connect()
        assert await answering.closed_by_server()
        assert (await later.get(b"/livez")).status == 200
        assert served.endpoint.statistics() == HealthStatistics(
            connections=1, answered=2, refused=1, timed_out=0, evicted=1
        )
    assert warnings(caplog) == [report(1, 0, 1, 0, 1), report(1, 1, 0, 1, 1)]


async def test_evictions_and_refusals_are_logged_at_most_once_per_interval(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    listener = MemoryListener()
    seen: list[tuple[float, list[str]]] = []
    options = {"max_connections": 1, "idle_timeout": 1000, "head_timeout": 1000}
    async with serving([listener], Switchboard(), **options) as served:
        start = trio.current_time()
        clients = [await listener.connect()]

        async def flood(count: int) -> None:
            for _ in range(count):
                clients.append(await listener.connect())
                await trio.testing.wait_all_tasks_blocked()

        def look() -> None:
            seen.append((trio.current_time() - start, warnings(caplog)))
            caplog.clear()

        await flood(100)  # one line at once, then the rest 10 s later
        look()
        await trio.sleep(REPORT_INTERVAL)
        await trio.testing.wait_all_tasks_blocked()  # the report is due now too
        look()
        await trio.sleep(REPORT_INTERVAL * 5)  # nothing new: no line
        look()
        await flood(1)  # more than an interval since the last: at once
        look()
        await flood(7)
        await served.stop()  # what is left is logged at STOP
        look()
        assert served.endpoint.statistics().evicted == 108
    assert seen == [
        (0, [report(1, 1, 0, 1, 0)]),
        (10, [report(1, 99, 0, 100, 0)]),
        (60, []),
        (60, [report(1, 1, 0, 101, 0)]),
        (60, [report(1, 7, 0, 108, 0)]),
    ]


async def test_probes_get_in_at_once_past_idle_connections_and_a_slowloris(
    autojump_clock: trio.testing.MockClock,
) -> None:
    listener = MemoryListener()
    async with (
        serving([listener], Switchboard()) as served,
        trio.open_nursery() as nursery,
    ):
        idle = [await listener.connect() for _ in range(300)]

        async def slowloris() -> None:
            # Trickles a head that never ends; closed, comes back a second later.
            while True:
                client = await listener.connect()
                with contextlib.suppress(trio.BrokenResourceError):
                    for byte in b"GET /livez HTTP/1.1\r\nX: " + b"x" * 1000:
                        await client.stream.send_all(bytes([byte]))
                        await trio.sleep(0.1)
                await trio.sleep(1)

        for _ in range(64):
            nursery.start_soon(slowloris)
        await trio.sleep(30)  # the slowloris at its worst, reconnecting
        for path in [b"/livez", b"/readyz"] * 10:
            start = trio.current_time()
            probe = await listener.connect()
            reply = await probe.get(path, b"GET", (b"connection", b"close"))
            assert reply.status == 200
            assert trio.current_time() == start
            await trio.sleep(1)
        nursery.cancel_scope.cancel()
        statistics = served.endpoint.statistics()
        assert statistics.answered == 20
        assert statistics.evicted > 300
        assert statistics.refused == 0
        assert statistics.connections <= 32
        del idle


async def test_a_client_that_leaves_mid_answer_ends_only_its_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="trio_graceful.health")
    listener = MemoryListener()
    async with serving([listener], Switchboard()) as served:
        client = await listener.connect(lockstep=True)
        await client.stream.send_all(client.request(b"GET", b"/livez"))
        await trio.testing.wait_all_tasks_blocked()  # the answer waits for us
        await client.stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert served.endpoint.statistics().connections == 0
        other = await listener.connect()
        assert (await other.get(b"/livez")).status == 200
    [message] = [r.getMessage() for r in caplog.records]
    assert message.startswith("health endpoint: a client went away: BrokenResource")


async def test_an_unexpected_error_ends_only_its_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken() -> None:
        raise RuntimeError("a bug in a stream")

    listener = MemoryListener()
    async with serving([listener], Switchboard()) as served:
        client, server = trio.testing.memory_stream_pair()
        assert isinstance(server.receive_stream, trio.testing.MemoryReceiveStream)
        server.receive_stream.receive_some_hook = broken
        await listener.offer(server)
        await client.send_all(Client(client).request(b"GET", b"/livez"))
        await trio.testing.wait_all_tasks_blocked()
        assert served.endpoint.statistics().connections == 0
        other = await listener.connect()
        assert (await other.get(b"/livez")).status == 200
    [record] = caplog.records
    assert (record.levelname, record.getMessage()) == (
        "ERROR",
        "health endpoint: a connection failed",
    )
    assert record.exc_info is not None
    assert str(record.exc_info[1]) == "a bug in a stream"


# ---------------------------------------------------------------- in a runner


def test_serves_as_a_runner_service() -> None:
    replies: list[Reply] = []
    listeners: list[trio.SocketListener] = []

    async def main() -> None:
        runner = trio_graceful.current_runner()
        listeners.extend(await open_health_listeners("127.0.0.1", 0))
        port = listeners[0].socket.getsockname()[1]
        endpoint = await runner.start_service(
            serve_health, listeners, Switchboard(), name="health"
        )
        assert isinstance(endpoint, HealthEndpoint)
        replies.append(await fetch_in_thread(port, "GET", "/readyz"))

    assert trio_graceful.run(main) == 0
    assert [reply.status for reply in replies] == [200]
    assert all(listener.socket.fileno() == -1 for listener in listeners)
