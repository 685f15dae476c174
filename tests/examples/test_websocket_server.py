"""The WebSocket CLOSE example server, in-process, on real loopback sockets.

The clients are real: trio-websocket's, and `WireClient`, which shows the
exact frames (the `websockets` library's client is in the signal tests).
Time is virtual: the mock clock jumps only after 10 ms of real time in which
nothing happened, so bytes in flight on loopback are never skipped over and
every time below is exact.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import random
import signal
from collections.abc import AsyncIterator

import attrs
import pytest
import trio
import trio.testing
import trio_websocket
import wsproto.events

import trio_graceful
from tests.support.examples import EXAMPLES, load_example
from tests.support.websocket_clients import (
    BINARY,
    CLOSE,
    CONTINUATION,
    PING,
    TEXT,
    ClientRecord,
    WireClient,
    client_frame,
    close_payload,
    open_trio_websocket,
    open_wire_client,
    pipelining_client,
)

example = load_example("websocket_close_server")
connection = load_example("websocket_connection")
random_requests = load_example("websocket_clients").random_requests
SHUTTING_DOWN = (1001, "the server is shutting down")


def counts(stats):
    """The request and connection tallies of a ServerStatistics, in order."""
    return (
        stats.closed_gracefully,
        stats.hard_closed,
        stats.requests_read,
        stats.answered,
        stats.refused,
        stats.lost,
    )


@pytest.fixture
def loopback_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0.01)


@attrs.define(eq=False)
class Running:
    server: example.WorkServer
    bundle: trio_graceful.Bundle
    port: int
    report: trio_graceful.CancelReport | None = None

    async def shutdown(self, grace: float) -> None:
        self.report = await self.bundle.shutdown(grace=grace)

    async def refused(self) -> None:
        """Check that a new TCP connection is refused."""
        with pytest.raises(
            OSError,
            match=rf"^all attempts to connect to 127\.0\.0\.1:{self.port} failed$",
        ):
            await trio.open_tcp_stream("127.0.0.1", self.port)


@contextlib.asynccontextmanager
async def running_server(**options: object) -> AsyncIterator[Running]:
    server = example.WorkServer(**options)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with trio_graceful.open_bundle(name="server") as bundle:
        _, inbox = bundle.open_inbox()
        await bundle.start(server.serve, inbox, listeners)
        yield Running(server, bundle, listeners[0].socket.getsockname()[1])
        if not bundle.cancelling:
            bundle.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def draining(
    *requests: tuple[int, int], grace: float = 10, **options: object
) -> AsyncIterator[tuple[Running, WireClient, float]]:
    """A `WireClient` with ``requests`` in flight when the server begins to
    shut down, at the time yielded last."""
    async with (
        running_server(**options) as srv,
        trio.open_nursery() as nursery,
        open_wire_client(srv.port) as client,
    ):
        for request_id, work_ms in requests:
            await client.send_request(request_id, work_ms)
        t0 = trio.current_time()
        nursery.start_soon(srv.shutdown, grace)
        yield srv, client, t0


async def request(ws, request_id, work_ms):
    await ws.send_message(json.dumps({"id": request_id, "work_ms": work_ms}))


def refusal(request_id):
    return {"id": request_id, "error": "shutting down"}


# -- serving ------------------------------------------------------------------


async def test_pipelined_requests_run_concurrently_and_answer_as_they_finish(
    loopback_clock,
):
    async with running_server() as srv, open_trio_websocket(srv.port) as ws:
        t0 = trio.current_time()
        for request_id, work_ms in [(1, 500), (2, 125), (3, 375), (4, 0), (5, 250)]:
            await request(ws, request_id, work_ms)
        answers = [
            (json.loads(await ws.get_message()), trio.current_time() - t0)
            for _ in range(5)
        ]
    assert answers == [
        ({"id": 4}, 0),
        ({"id": 2}, 0.125),
        ({"id": 5}, 0.25),
        ({"id": 3}, 0.375),
        ({"id": 1}, 0.5),
    ]
    stats = srv.server.statistics()
    assert (stats.requests_read, stats.answered) == (5, 5)


async def test_requests_beyond_max_in_flight_wait_for_a_free_slot(loopback_clock):
    async with (
        running_server(max_in_flight=2) as srv,
        open_trio_websocket(srv.port) as ws,
    ):
        t0 = trio.current_time()
        for request_id in (1, 2, 3):
            await request(ws, request_id, 1000)
        answers = [
            (json.loads(await ws.get_message())["id"], trio.current_time() - t0)
            for _ in range(3)
        ]
    assert sorted(answers) == [(1, 1), (2, 1), (3, 2)]


# -- graceful shutdown ----------------------------------------------------------


async def test_shutdown_answers_what_was_read_then_closes_with_1001(loopback_clock):
    async with (
        running_server() as srv,
        trio.open_nursery() as nursery,
        open_wire_client(srv.port) as client,
    ):
        t0 = trio.current_time()
        await client.send_request(1, 1000)
        await client.send_request(2, 3000)
        await trio.sleep(0.5)
        nursery.start_soon(srv.shutdown, 10)
        await srv.server.wait_draining()
        # The listener is closed at once, while the connection drains.
        await srv.refused()
        assert srv.server.statistics().connections_open == 1
        assert await client.receive_json() == {"id": 1}
        assert trio.current_time() - t0 == 1
        assert await client.receive_json() == {"id": 2}
        assert trio.current_time() - t0 == 3
        assert await client.receive_close() == SHUTTING_DOWN
        assert trio.current_time() - t0 == 3
        await client.send_close(1001)
        await client.receive_eof()
    assert srv.report is not None
    assert srv.report.finished_at - t0 == 3
    assert srv.report.hard_cancelled_at is None
    assert counts(srv.server.statistics()) == (1, 0, 2, 2, 0, 0)


async def test_requests_read_during_the_drain_are_processed(loopback_clock):
    async with draining((1, 1000)) as (srv, client, t0):
        await trio.sleep(0.5)
        await client.send_request(2, 1000)  # the client cannot know yet
        await trio.sleep(0.25)
        await client.send_request(3, 0)
        assert await client.receive_json() == {"id": 3}
        assert trio.current_time() - t0 == 0.75
        assert await client.receive_json() == {"id": 1}
        assert trio.current_time() - t0 == 1
        assert await client.receive_json() == {"id": 2}
        assert trio.current_time() - t0 == 1.5
        # CLOSE as soon as nothing is in flight
        assert await client.receive_close() == SHUTTING_DOWN
        assert trio.current_time() - t0 == 1.5
        await client.send_request(4, 0)  # after the server's CLOSE: dropped
        await client.send_close(1001)
        await client.receive_eof()
    assert counts(srv.server.statistics()) == (1, 0, 3, 3, 0, 0)


async def test_reject_during_drain_refuses_new_requests_at_once(loopback_clock):
    async with draining((1, 1000), reject_during_drain=True) as (srv, client, t0):
        await trio.sleep(0.5)
        await client.send_request(2, 1000)
        assert await client.receive_json() == refusal(2)
        assert trio.current_time() - t0 == 0.5
        await client.send_text("[]")  # not a request: an error reply as ever
        assert await client.receive_json() == {
            "error": 'request must be a JSON object {"id": <int>, "work_ms": <int>}, '
            "not []"
        }
        assert await client.receive_json() == {"id": 1}  # read before: processed
        assert trio.current_time() - t0 == 1
        assert await client.receive_close() == SHUTTING_DOWN
        await client.send_close(1001)
        await client.receive_eof()
    stats = srv.server.statistics()
    assert counts(stats) == (1, 0, 2, 1, 1, 0)
    assert stats.malformed == 1


async def test_idle_connections_are_closed_with_1001_at_once(loopback_clock):
    codes: list[tuple[int, str | None, float]] = []

    async def idle_client(port: int, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with open_trio_websocket(port) as ws:
            task_status.started()
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                await ws.get_message()
            reason = closed.value.reason
            codes.append((reason.code, reason.reason, trio.current_time()))

    async with running_server() as srv, trio.open_nursery() as clients:
        for _ in range(3):
            await clients.start(idle_client, srv.port)
        t0 = trio.current_time()
        await srv.shutdown(grace=10)
        assert trio.current_time() == t0
    assert codes == [(*SHUTTING_DOWN, t0)] * 3
    assert counts(srv.server.statistics()) == (3, 0, 0, 0, 0, 0)


async def test_client_that_never_answers_close_is_hard_closed_at_the_grace(
    loopback_clock,
):
    async with (
        running_server() as srv,
        trio.open_nursery() as nursery,
        open_wire_client(srv.port) as silent,
    ):
        async with open_trio_websocket(srv.port) as polite:
            t0 = trio.current_time()
            nursery.start_soon(srv.shutdown, 5)
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                await polite.get_message()
            assert closed.value.reason.code == 1001
            assert trio.current_time() == t0
        assert await silent.receive_close() == SHUTTING_DOWN
        assert trio.current_time() == t0
        await silent.receive_eof()  # no answer from us: the server hangs up
        assert trio.current_time() - t0 == 5
    assert srv.report is not None
    assert srv.report.hard_cancelled_at == t0 + 5
    assert counts(srv.server.statistics()) == (1, 1, 0, 0, 0, 0)


async def test_request_grace_refuses_slow_requests_then_closes(loopback_clock):
    async with draining((1, 1000), (2, 5000), request_grace=2) as (srv, client, t0):
        assert await client.receive_json() == {"id": 1}
        assert trio.current_time() - t0 == 1
        assert await client.receive_json() == refusal(2)
        assert trio.current_time() - t0 == 2
        assert await client.receive_close() == SHUTTING_DOWN
        assert trio.current_time() - t0 == 2
        await client.send_close(1001)
        await client.receive_eof()
    assert counts(srv.server.statistics()) == (1, 0, 2, 1, 1, 0)


async def test_requests_waiting_for_a_slot_are_refused_at_the_cut_off(
    loopback_clock,
):
    # One slot: request 2 waits behind request 1 when the work is cut off.
    options = {"request_grace": 2, "max_in_flight": 1}
    async with draining((1, 5000), (2, 100), **options) as (srv, client, t0):
        assert [await client.receive_json() for _ in range(2)] == [
            refusal(1),
            refusal(2),
        ]
        assert trio.current_time() - t0 == 2
        assert await client.receive_close() == SHUTTING_DOWN
        await client.send_close(1001)
        await client.receive_eof()
    assert counts(srv.server.statistics()) == (1, 0, 2, 0, 2, 0)


async def test_outer_grace_wins_and_keeps_a_tenth_for_the_close(loopback_clock):
    async with draining((1, 60_000), request_grace=20) as (srv, client, t0):
        assert await client.receive_json() == refusal(1)
        assert trio.current_time() - t0 == 9
        assert await client.receive_close() == SHUTTING_DOWN
        await client.send_close(1001)
        await client.receive_eof()
        assert trio.current_time() - t0 == 9
    assert counts(srv.server.statistics()) == (1, 0, 1, 0, 1, 0)


async def test_a_second_shutdown_with_grace_0_closes_everything_at_once(
    loopback_clock,
):
    async with draining((1, 5000)) as (srv, client, t0):
        await trio.sleep(1)
        await srv.bundle.cancel(grace=0)
        assert trio.current_time() - t0 == 1
        await client.receive_eof()
    assert counts(srv.server.statistics()) == (0, 1, 1, 0, 0, 1)


async def test_pipelining_clients_through_the_shutdown_lose_nothing(loopback_clock):
    records = [ClientRecord() for _ in range(10)]
    async with running_server(request_grace=2) as srv, trio.open_nursery() as clients:
        for index, record in enumerate(records):
            rng = random.Random(index)
            requests = random_requests(1000 * index, rng, (0, 3000))
            clients.start_soon(
                functools.partial(pipelining_client, pause=(0.01, 0.2), rng=rng),
                srv.port,
                requests,
                record,
            )
        await trio.sleep(3)
        await srv.shutdown(grace=10)
    stats = srv.server.statistics()
    assert stats.requests_read == stats.answered + stats.refused
    assert (stats.closed_gracefully, stats.hard_closed, stats.lost) == (10, 0, 0)
    for record in records:
        assert record.unanswered() == []
        assert (record.close_code, record.close_reason) == SHUTTING_DOWN
        assert record.refused  # the request grace ran out while they sent
    assert sum(len(r.answered) + len(r.refused) for r in records) == stats.requests_read


async def test_connection_still_in_its_opening_handshake_is_closed_at_once(
    loopback_clock,
):
    async with (
        running_server() as srv,
        open_wire_client(srv.port, handshake=False) as client,
    ):
        await trio.testing.wait_all_tasks_blocked()
        t0 = trio.current_time()
        await srv.shutdown(grace=10)
        assert trio.current_time() == t0
        await client.receive_eof()
    assert counts(srv.server.statistics()) == (0, 0, 0, 0, 0, 0)


async def test_opening_handshake_times_out(loopback_clock):
    async with (
        running_server() as srv,
        open_wire_client(srv.port, handshake=False) as client,
    ):
        t0 = trio.current_time()
        await client.receive_eof()
        assert trio.current_time() - t0 == example.HANDSHAKE_TIMEOUT


# -- the client closes ------------------------------------------------------


async def test_client_close_is_answered_at_once_while_others_are_served(
    loopback_clock,
):
    async with (
        running_server() as srv,
        open_trio_websocket(srv.port) as other,
        open_wire_client(srv.port) as leaving,
    ):
        t0 = trio.current_time()
        await leaving.send_request(1, 10_000)
        await request(other, 10, 2000)
        await trio.sleep(1)
        await leaving.send_close(1000, "bye")
        assert await leaving.receive_close() == (1000, "bye")
        await leaving.receive_eof()
        assert trio.current_time() - t0 == 1
        await trio.sleep(0.5)
        await request(other, 11, 1000)
        assert json.loads(await other.get_message()) == {"id": 10}
        assert trio.current_time() - t0 == 2
        assert json.loads(await other.get_message()) == {"id": 11}
        assert trio.current_time() - t0 == 2.5
        stats = srv.server.statistics()
    assert stats.connections_open == 1
    assert (stats.answered, stats.lost) == (2, 1)


@pytest.mark.parametrize("echo", [False, True])
async def test_client_close_between_the_fragments_of_a_message_is_answered(
    loopback_clock, echo
):
    # RFC 6455 (section 5.4) lets a control frame come between the fragments
    # of a message: the CLOSE ends the connection and the unfinished message.
    async with running_server(echo=echo) as srv, open_wire_client(srv.port) as client:
        await client.send_frame(TEXT, b'{"id": 1, ', fin=False)
        await client.send_close(1000, "bye")
        await client.send_frame(CONTINUATION, b'"work_ms": 0}')  # after it: dropped
        assert await client.receive_close() == (1000, "bye")
        await client.receive_eof()
        await trio.testing.wait_all_tasks_blocked()
        stats = srv.server.statistics()
    assert counts(stats) == (1, 0, 0, 0, 0, 0)
    assert stats.malformed == 0


REQUEST_FRAME = client_frame(TEXT, json.dumps({"id": 1, "work_ms": 0}).encode())
INVALID_UTF8_FRAME = client_frame(TEXT, b"\xff")
BINARY_FRAME = client_frame(BINARY, b"\x00")
CLOSE_FRAME = client_frame(CLOSE, close_payload(1000))
INVALID_UTF8 = (1007, "invalid UTF-8 in a text message")


@pytest.mark.parametrize(
    ("frames", "close", "read", "malformed"),
    [
        # read together with the client's CLOSE: read, and lost
        ([REQUEST_FRAME, CLOSE_FRAME], (1000, ""), 1, 0),
        # before a frame that fails the connection: read, and lost
        ([REQUEST_FRAME, INVALID_UTF8_FRAME], INVALID_UTF8, 1, 0),
        # after a frame that fails it: not taken
        ([INVALID_UTF8_FRAME, REQUEST_FRAME, CLOSE_FRAME], (1000, ""), 0, 0),
        # the server decides to close (1003), but the client's CLOSE was first
        ([BINARY_FRAME, CLOSE_FRAME], (1000, ""), 0, 1),
    ],
)
async def test_messages_read_with_the_end_of_a_connection_are_counted(
    loopback_clock, frames, close, read, malformed
):
    async with running_server() as srv, open_wire_client(srv.port) as client:
        await client.stream.send_all(b"".join(frames))  # so that one read has all
        assert await client.receive_close() == close
        await client.receive_eof()
        await trio.testing.wait_all_tasks_blocked()
        # Over at once on the server's side, though this client stays.
        stats = srv.server.statistics()
        assert stats.connections_open == 0
    assert counts(stats) == (1, 0, read, 0, 0, read)
    assert stats.malformed == malformed


async def test_client_close_during_the_drain_counts_as_graceful(loopback_clock):
    async with draining((1, 3000)) as (srv, client, t0):
        await trio.sleep(1)
        await client.send_close(1000, "bye")
        assert await client.receive_close() == (1000, "bye")
        await client.receive_eof()
        assert trio.current_time() - t0 == 1
    # The request's answer could no longer be sent: its work stopped at once.
    assert counts(srv.server.statistics()) == (1, 0, 1, 0, 0, 1)


# -- echo ---------------------------------------------------------------------


async def test_a_cancelled_flush_keeps_exactly_what_it_did_not_send(loopback_clock):
    # 32 MiB, more than loopback's socket buffers take: the send blocks part way.
    message = "0123456789abcdef" * 2**21
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    accepted: list[object] = []

    async def accept() -> None:
        stream = await listeners[0].accept()
        accepted.append(await connection.accept_websocket(stream, max_message=2**10))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept)
        async with open_wire_client(listeners[0].socket.getsockname()[1]) as client:
            await trio.testing.wait_all_tasks_blocked()
            [ws] = accepted
            ws.send_nowait(message)
            with trio.move_on_after(1) as scope:
                await ws.flush()  # the client reads nothing yet
            assert scope.cancelled_caught
            nursery.start_soon(ws.flush)  # the rest, while the client reads
            received = []
            while True:
                event = await client.receive()
                assert isinstance(event, wsproto.events.TextMessage), event
                received.append(event.data)
                if event.message_finished:
                    break
            assert "".join(received) == message
            await ws.stream.aclose()
    for listener in listeners:
        await listener.aclose()


async def test_echo_mode_echoes_text_binary_and_fragmented_messages(loopback_clock):
    async with (
        running_server(echo=True) as srv,
        open_wire_client(srv.port) as client,
    ):
        await client.send_text("hello")
        assert await client.receive() == wsproto.events.TextMessage("hello")
        await client.send_frame(BINARY, b"\x00\xff")
        assert await client.receive() == wsproto.events.BytesMessage(b"\x00\xff")
        # "é" split across two fragments, a PING between them
        await client.send_frame(TEXT, b"caf\xc3", fin=False)
        await client.send_frame(PING, b"p")
        await client.send_frame(CONTINUATION, b"\xa9!")
        assert await client.receive() == wsproto.events.Pong(b"p")
        assert await client.receive() == wsproto.events.TextMessage("café!")
        await client.send_frame(BINARY, b"ab", fin=False)
        await client.send_frame(CONTINUATION, b"cd")
        assert await client.receive() == wsproto.events.BytesMessage(b"abcd")
        await client.send_text("bye")
        assert await client.receive() == wsproto.events.TextMessage("bye")
        await srv.shutdown(grace=10)
        assert await client.receive_close() == SHUTTING_DOWN


async def test_echo_mode_with_trio_websocket(loopback_clock):
    async with (
        running_server(echo=True) as srv,
        open_trio_websocket(srv.port) as ws,
    ):
        for message in ["x" * 70_000, b"\x01" * 200_000, "", b""]:
            await ws.send_message(message)
            assert await ws.get_message() == message


# -- malformed input ------------------------------------------------------------

BAD_REQUESTS = [
    (
        "hello",
        {
            "error": "request is not valid JSON: "
            "Expecting value: line 1 column 1 (char 0)"
        },
    ),
    ("[" * 100_000, {"error": "request is not valid JSON: it nests too deeply"}),
    (
        '{"id": 1' + "0" * 200 + "}",
        {"error": "request has a number longer than 100 digits"},
    ),
    (
        "[1, 2]",
        {
            "error": 'request must be a JSON object {"id": <int>, "work_ms": <int>}, '
            "not [1, 2]"
        },
    ),
    ('{"work_ms": 5}', {"error": "request must have an id"}),
    ('{"id": "7", "work_ms": 5}', {"error": 'id must be an integer, not "7"'}),
    ('{"id": true, "work_ms": 5}', {"error": "id must be an integer, not true"}),
    ('{"id": 7.0, "work_ms": 5}', {"error": "id must be an integer, not 7.0"}),
    ('{"id": NaN, "work_ms": 5}', {"error": "id must be an integer, not NaN"}),
    ('{"id": 7}', {"id": 7, "error": "request must have a work_ms"}),
    (
        '{"id": 7, "work_ms": -1}',
        {"id": 7, "error": "work_ms must be an integer from 0 to 3600000, not -1"},
    ),
    (
        '{"id": 7, "work_ms": 3600001}',
        {"id": 7, "error": "work_ms must be an integer from 0 to 3600000, not 3600001"},
    ),
    (
        '{"id": 7, "work_ms": 1.5}',
        {"id": 7, "error": "work_ms must be an integer from 0 to 3600000, not 1.5"},
    ),
    (
        json.dumps({"id": 7, "work_ms": "x" * 100}),
        {
            "id": 7,
            "error": "work_ms must be an integer from 0 to 3600000, "
            'not "' + "x" * 36 + "...",
        },
    ),
]


@pytest.mark.parametrize(("text", "reply"), BAD_REQUESTS)
async def test_malformed_request_gets_an_error_reply(loopback_clock, text, reply):
    async with running_server() as srv, open_wire_client(srv.port) as client:
        await client.send_text(text)
        assert await client.receive_json() == reply
        # The connection stays open and keeps serving.
        await client.send_request(8, 0)
        assert await client.receive_json() == {"id": 8}
    stats = srv.server.statistics()
    assert (stats.malformed, stats.requests_read) == (1, 1)


def test_extra_keys_are_ignored():
    assert example.parse_request('{"id": 3, "work_ms": 4, "note": "hi"}') == (3, 4)


async def test_binary_message_gets_close_1003_after_the_requests_in_flight(
    loopback_clock,
):
    async with running_server() as srv, open_wire_client(srv.port) as client:
        await client.send_request(1, 1000)
        t0 = trio.current_time()
        await client.send_frame(BINARY, b'{"id": 2, "work_ms": 0}')
        await client.send_request(3, 0)  # read before the CLOSE: answered
        assert await client.receive_json() == {"id": 3}
        assert await client.receive_json() == {"id": 1}
        assert await client.receive_close() == (
            1003,
            "this server accepts text messages only",
        )
        assert trio.current_time() - t0 == 1
        await client.send_close(1003)
        await client.receive_eof()
    assert srv.server.statistics().malformed == 1


async def test_invalid_utf8_gets_close_1007_and_fails_only_its_connection(
    loopback_clock,
):
    async with (
        running_server() as srv,
        open_trio_websocket(srv.port) as other,
        open_wire_client(srv.port) as client,
    ):
        await request(other, 1, 1000)
        await client.send_frame(TEXT, b'{"id": 1, "work_ms": "\xff"}')
        assert await client.receive_close() == (1007, "invalid UTF-8 in a text message")
        await client.receive_eof()
        assert json.loads(await other.get_message()) == {"id": 1}
        assert srv.server.statistics().connections_open == 1


async def test_message_too_big_gets_close_1009(loopback_clock):
    async with (
        running_server() as srv,
        open_trio_websocket(srv.port) as other,
        open_wire_client(srv.port) as client,
    ):

        async def send_too_much() -> None:
            # The server fails the connection as soon as it reads the length.
            with contextlib.suppress(trio.BrokenResourceError):
                await client.send_text("x" * (2**20 + 1))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_too_much)
            event = await client.receive()
        # The CLOSE goes out first; a reset of the unread rest may overtake it.
        if event is not None:
            assert isinstance(event, wsproto.events.CloseConnection)
            assert event.code == 1009
        await request(other, 1, 0)
        assert json.loads(await other.get_message()) == {"id": 1}


async def test_junk_instead_of_a_handshake_is_closed(loopback_clock):
    async with running_server() as srv, open_trio_websocket(srv.port) as other:
        async with await trio.open_tcp_stream("127.0.0.1", srv.port) as stream:
            await stream.send_all(b"hello\r\n\r\n")
            assert await stream.receive_some() == b""
        await request(other, 1, 0)
        assert json.loads(await other.get_message()) == {"id": 1}


async def test_a_plain_http_request_gets_an_http_error(loopback_clock):
    async with (
        running_server() as srv,
        await trio.open_tcp_stream("127.0.0.1", srv.port) as stream,
    ):
        await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        response = b""
        while chunk := await stream.receive_some():
            response += chunk
    assert response.startswith(b"HTTP/1.1 426 ")


# -- signals, in this process, through trio_graceful.run --------------------


def signalled_server(signum: signal.Signals) -> example.WorkServer:
    """Run the server under `trio_graceful.run` and send this process a signal.

    A client keeps a 5 s request in flight; the signal comes 1 s later, and
    the client sends one more request (it cannot know yet).
    """
    server = example.WorkServer()

    async def client(port: int) -> None:
        async with open_wire_client(port) as wire:
            await wire.send_request(1, 5000)
            await trio.sleep(1)
            os.kill(os.getpid(), signum)
            await trio.sleep(1)
            await wire.send_request(2, 500)
            assert await wire.receive_json() == {"id": 2}
            assert await wire.receive_json() == {"id": 1}
            assert await wire.receive_close() == SHUTTING_DOWN
            await wire.send_close(1001)
            await wire.receive_eof()

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        runner = trio_graceful.current_runner()
        _, inbox = runner.root.open_inbox()
        async with trio.open_nursery() as clients:
            clients.start_soon(client, listeners[0].socket.getsockname()[1])
            await server.serve(inbox, listeners)

    status = trio_graceful.run(
        main,
        grace=10,
        exit_codes=example.EXIT_CODES,
        clock=trio.testing.MockClock(autojump_threshold=0.01),
    )
    assert status == 0
    return server


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_shuts_down_gracefully(signum):
    server = signalled_server(signum)
    assert counts(server.statistics()) == (1, 0, 2, 2, 0, 0)


# -- values and arguments -------------------------------------------------------


def test_summary_line_counts_every_request_once():
    stats = example.ServerStatistics(
        connections_accepted=20,
        connections_open=0,
        closed_gracefully=18,
        hard_closed=2,
        requests_read=40,
        answered=37,
        refused=2,
        lost=1,
        malformed=0,
        draining_since=0.0,
    )
    assert stats.summary() == (
        "shutdown: 18 connections closed gracefully, 2 hard-closed; "
        "requests read: 40 = 37 answered + 2 refused + 1 lost"
    )


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"request_grace": -1}, ValueError, "request_grace must be >= 0, not -1"),
        (
            {"request_grace": math.nan},
            ValueError,
            "request_grace must be >= 0, not nan",
        ),
        ({"request_grace": "5"}, TypeError, "request_grace must be a number, not '5'"),
        (
            {"max_in_flight": 0},
            ValueError,
            "max_in_flight must be an integer >= 1, not 0",
        ),
        (
            {"max_in_flight": 1.5},
            ValueError,
            "max_in_flight must be an integer >= 1, not 1.5",
        ),
    ],
)
def test_bad_server_options(options, error, message):
    with pytest.raises(error, match=rf"^{message}$"):
        example.WorkServer(**options)


def test_without_options_the_server_listens_on_8000_with_the_documented_graces():
    args = example.parse_args([])
    assert (args.host, args.port, args.grace, args.request_grace) == (
        "127.0.0.1",
        8000,
        10,
        20,
    )
    assert (args.log_level, args.echo, args.reject_during_drain) == (
        "INFO",
        False,
        False,
    )
    args = example.parse_args(["--grace", "inf", "--request-grace", "0", "--port", "0"])
    assert (args.grace, args.request_grace, args.port) == (math.inf, 0, 0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--grace", "-1"], "argument --grace: grace must be >= 0, not -1.0"),
        (["--grace", "nan"], "argument --grace: grace must be >= 0, not nan"),
        (
            ["--grace", "soon"],
            "argument --grace: grace must be a number of seconds, not 'soon'",
        ),
        (
            ["--request-grace", "-2"],
            "argument --request-grace: request_grace must be >= 0, not -2.0",
        ),
        (
            ["--port", "70000"],
            "argument --port: port must be from 0 to 65535, not '70000'",
        ),
        (["--port", "x"], "argument --port: port must be from 0 to 65535, not 'x'"),
    ],
)
def test_bad_arguments(capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        example.parse_args(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: {message}")


def test_readme_demo_command_runs_this_example():
    readme = (EXAMPLES.parent / "README.md").read_text().splitlines()
    command = readme[readme.index("<!-- demo-command -->") + 2]
    assert command == (
        'python3 -m venv .venv && .venv/bin/pip install -e ".[websocket]" '
        "&& .venv/bin/python examples/websocket_close_server.py --demo"
    )
