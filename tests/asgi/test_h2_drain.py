"""The drain of serve_asgi over HTTP/2, frame by frame, in exact virtual time.

A raw client (tests/support/h2_client.py) opens streams with prior knowledge
on the server's Unix socket and reads every frame, so that a test sees what
a library client hides: which streams ended, what each GOAWAY named, what
came after the last one, and whether the connection then ended with a FIN.
The drain races the request tasks against the protocol's send task, whose
order Trio's scheduler varies from run to run: the drain runs many times.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.trio.task_group import TaskGroup
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState

from tests.support.asgi_app import Log, make_app
from tests.support.asgi_server import Served, serving
from tests.support.h2_client import (
    ACK,
    NO_ERROR,
    PREFACE,
    REFUSED_STREAM,
    GoAway,
    H2Client,
    Type,
    check_drain,
    encode_frame,
)
from trio_graceful._core._statetable import IllegalTransitionError
from trio_graceful.asgi._protocols import (
    DRAIN_PHASES,
    DrainingH2Protocol,
    DrainPhase,
    DrainStep,
)

RUNS = 20


async def connect(served: Served) -> H2Client:
    assert served.path is not None
    client = H2Client(await trio.open_unix_socket(str(served.path)))
    await client.start()
    return client


async def read_until_goaway(client: H2Client) -> None:
    while not client.goaways:
        assert not client.eof, client.frames
        assert not client.reset, client.frames
        await client.receive()


@pytest.mark.parametrize("run", range(RUNS))
async def test_every_stream_the_goaway_names_ends_then_a_fin(
    run: int, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(make_app(Log()), tmp_path) as served:
        client = await connect(served)
        answered = await client.get(*["/work?s=1.5"] * 4)
        await trio.sleep(0.5)
        async with served.stopping(10):
            await read_until_goaway(client)
            assert trio.current_time() == 0.5  # at once
            # Opened after the GOAWAY, as by a client that has not read it yet:
            # refused, not processed.
            refused = await client.get("/work")
            await client.read_to_the_end()
            assert trio.current_time() == 1.5  # the FIN, once the last ended
            await client.stream.aclose()
    check_drain(client, dict.fromkeys(answered, b"done"), refused)
    assert [g.last_stream_id for g in client.goaways] == [7, 7]


async def test_an_idle_connection_gets_one_goaway_and_a_fin(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(make_app(Log()), tmp_path) as served:
        client = await connect(served)
        [stream_id] = await client.get("/work")
        await client.read_until_ended(stream_id)
        async with served.stopping(10):
            await client.read_to_the_end()
            assert trio.current_time() == 0
            await client.stream.aclose()
    check_drain(client, {stream_id: b"done"}, [])
    assert [g.last_stream_id for g in client.goaways] == [1]


async def test_streams_cut_off_get_a_503_or_their_end(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(make_app(Log()), tmp_path) as served:
        client = await connect(served)
        waiting, streaming = await client.get("/work?s=60", "/stream?n=100&s=1")
        await trio.sleep(0.5)
        async with served.stopping(10):
            await client.read_to_the_end()
            # The cut-off: the reserve of 1 s before the deadline at 10.5.
            assert trio.current_time() == 9.5
            await client.stream.aclose()
    chunks = b"".join(b"data: %02d\n\n" % i for i in range(10))  # at 0 to 9
    check_drain(client, {waiting: b"", streaming: chunks}, [])
    cut = client.replies[waiting]
    assert (cut.status, cut.headers[b"retry-after"]) == (503, b"1")
    assert client.replies[streaming].status == 200
    assert served.report is not None
    [server] = served.report.children
    assert sorted(server.notes) == [
        "cut off: GET /stream: response ended",
        "cut off: GET /work: refused with 503",
    ]


async def test_a_client_that_leaves_does_not_hold_the_drain(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # A client that gives up on reading the GOAWAY (httpx does): the app's
    # response can no longer be sent, and its wait for that ends at once.
    async with serving(make_app(Log()), tmp_path) as served:
        client = await connect(served)
        await client.get("/work?s=1")
        await trio.sleep(0.5)
        async with served.stopping(10):
            await read_until_goaway(client)
            await client.stream.aclose()
    assert trio.current_time() == 1  # the app's end, not the cut-off at 9.5
    assert served.server.statistics().requests_cut_off == 0


async def test_stop_while_the_connection_is_busy_still_sends_the_goaway(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # STOP comes while the connection handles what it read (a write waits
    # for a slow client, say): the GOAWAY goes out once it is done, not when
    # the client next sends something.
    handle = DrainingH2Protocol.handle

    async def busy_handle(self: DrainingH2Protocol, event: Event) -> None:
        await handle(self, event)
        if isinstance(event, RawData) and PING in event.data:
            await trio.sleep(1)  # the PING's ACK is still being written

    monkeypatch.setattr(DrainingH2Protocol, "handle", busy_handle)
    async with serving(make_app(Log()), tmp_path) as served:
        client = await connect(served)
        [first] = await client.get("/work")
        await client.read_until_ended(first)  # the SETTINGS are acknowledged
        [stream_id] = await client.get("/work?s=3")
        await trio.sleep(0.5)
        await client.stream.send_all(PING)
        await trio.testing.wait_all_tasks_blocked()
        async with served.stopping(10):
            await read_until_goaway(client)
            assert trio.current_time() == 1.5
            await client.read_to_the_end()
            assert trio.current_time() == 3
            await client.stream.aclose()
    check_drain(client, {first: b"done", stream_id: b"done"}, [])


@attrs.define(eq=False)
class Wire:
    """The protocol's side of a connection whose every write takes a while.

    What is written is kept in order at once, as the connection queues it;
    the writer then waits, as for a slow socket, and other tasks run.
    """

    sent: bytearray = attrs.field(factory=bytearray)
    idle_at: list[int] = attrs.field(factory=list[int])
    """For each ``Updated(idle=True)``, how many bytes had been written."""
    closed: bool = False

    async def send(self, event: Event) -> None:
        if isinstance(event, RawData):
            self.sent += event.data
            await trio.sleep(WRITE_TIME)
        elif isinstance(event, Updated) and event.idle:
            self.idle_at.append(len(self.sent))
        elif isinstance(event, Closed):
            self.closed = True


WRITE_TIME = 0.1


@contextlib.asynccontextmanager
async def open_protocol(wire: Wire) -> AsyncIterator[DrainingH2Protocol]:
    """A `DrainingH2Protocol` on ``wire``, with Hypercorn's own task group."""
    context = WorkerContext(None)
    async with TaskGroup() as task_group:
        protocol = DrainingH2Protocol(
            ASGIWrapper(make_app(Log())),
            Config(),
            context,
            task_group,
            ConnectionState({}),
            False,
            None,
            None,
            wire.send,
        )
        await protocol.initiate()
        yield protocol
        await protocol.handle(Closed())


async def test_the_last_goaway_waits_for_the_end_stream_of_a_slow_write(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The app's last body message returns once the send task has taken its
    # bytes; the stream then closes while they, and the END_STREAM after
    # them, are still being written. The connection must not close first.
    wire = Wire()
    client = H2Client(trio.testing.memory_stream_pair()[0])
    async with open_protocol(wire) as protocol:
        await protocol.handle(RawData(PREFACE + encode_frame(Type.SETTINGS, 0, 0)))
        await protocol.handle(RawData(client.encode_get("/work?s=1")))
        await trio.sleep(0.5)
        await protocol.context.terminated.set()
        await protocol.begin_drain()
        assert not protocol.idle
        await trio.sleep(1)
        assert protocol.idle
        # The connection hears that it may close only after the last GOAWAY.
        assert wire.idle_at
        assert set(wire.idle_at) == {len(wire.sent)}
        client.feed(bytes(wire.sent))
        reply = client.replies[1]
        assert (reply.status, reply.body, reply.ended) == (200, b"done", True)
        assert client.goaways == [GoAway(1, NO_ERROR), GoAway(1, NO_ERROR)]
        assert client.frames[-1].type == Type.GOAWAY
        # What the client sends on reading it all is dropped: h2, closed,
        # would answer it with a GOAWAY, PROTOCOL_ERROR.
        sent = len(wire.sent)
        await protocol.handle(RawData(client.encode_get("/work") + PING))
        assert len(wire.sent) == sent


async def test_an_idle_connection_is_done_at_once_and_drops_what_comes_after(
    autojump_clock: trio.testing.MockClock,
) -> None:
    wire = Wire()
    client = H2Client(trio.testing.memory_stream_pair()[0])
    async with open_protocol(wire) as protocol:
        await protocol.handle(RawData(PREFACE + encode_frame(Type.SETTINGS, 0, 0)))
        await protocol.context.terminated.set()
        await protocol.begin_drain()
        assert protocol.idle
        sent = len(wire.sent)
        await protocol.handle(RawData(encode_frame(Type.SETTINGS, ACK, 0) + PING))
        assert len(wire.sent) == sent
    client.feed(bytes(wire.sent))
    assert client.goaways == [GoAway(0, NO_ERROR)]
    assert client.frames[-1].type == Type.GOAWAY


async def test_a_stream_opened_between_stop_and_the_goaway_is_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # STOP came while the connection was busy, before it told the protocol:
    # the GOAWAY, sent first, names the last stream that went to the app,
    # not the one that came with it.
    wire = Wire()
    client = H2Client(trio.testing.memory_stream_pair()[0])
    async with open_protocol(wire) as protocol:
        await protocol.handle(RawData(PREFACE + encode_frame(Type.SETTINGS, 0, 0)))
        await protocol.handle(RawData(client.encode_get("/work?s=1")))
        await protocol.context.terminated.set()
        await protocol.handle(RawData(client.encode_get("/work")))
        await protocol.begin_drain()
        await trio.sleep(2)
        assert protocol.idle
    client.feed(bytes(wire.sent))
    assert client.goaways == [GoAway(1, NO_ERROR), GoAway(1, NO_ERROR)]
    assert (client.replies[1].body, client.replies[1].ended) == (b"done", True)
    assert client.replies[3].reset == REFUSED_STREAM
    assert client.frames[-1].type == Type.GOAWAY


PING = encode_frame(Type.PING, 0, 0, bytes(8))


def test_a_drain_sends_its_goaways_in_order_and_never_goes_back() -> None:
    # h11-style: the table alone, step by step; a refused move says why.
    serving, announced, closed = DrainPhase
    assert DRAIN_PHASES.move(serving, DrainStep.ANNOUNCE, subject="d") is announced
    assert DRAIN_PHASES.move(announced, DrainStep.CLOSE, subject="d") is closed
    assert DRAIN_PHASES.reachable([serving]) == {announced, closed}
    assert DRAIN_PHASES.left() == {serving, announced}  # closed is final
    with pytest.raises(
        IllegalTransitionError,
        match=(
            r"^an HTTP/2 connection's drain cannot announce the drain while "
            r"announced; that is legal only while serving$"
        ),
    ):
        DRAIN_PHASES.move(
            announced, DrainStep.ANNOUNCE, subject="an HTTP/2 connection's drain"
        )
    with pytest.raises(
        IllegalTransitionError,
        match=(
            r"^d cannot close the connection while serving; "
            r"that is legal only while announced$"
        ),
    ):
        DRAIN_PHASES.move(serving, DrainStep.CLOSE, subject="d")
