"""InboxReceiver.until_stop: the stoppable idle point."""

from __future__ import annotations

import functools
import math
import os

import pytest
import trio
import trio.testing

from trio_graceful import STOP, open_bundle, open_inbox, open_stdin_lines


async def test_returns_the_source_result(autojump_clock):
    _, inbox = open_inbox[int]()
    source_tx, source_rx = trio.open_memory_channel[str](1)
    source_tx.send_nowait("hello")
    with trio.testing.assert_checkpoints():
        assert await inbox.until_stop(source_rx.receive) == "hello"
    assert not inbox.stop_received


async def test_stop_ends_the_wait_and_cancels_the_source(autojump_clock):
    t0 = trio.current_time()
    tx, inbox = open_inbox[int]()
    cancelled: list[bool] = []

    async def source():
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.append(True)
            raise

    async with trio.open_nursery() as nursery:

        async def stop_later():
            await trio.sleep(4)
            tx.stop()

        nursery.start_soon(stop_later)
        assert await inbox.until_stop(source) is STOP
    assert trio.current_time() - t0 == 4
    assert cancelled == [True]
    assert inbox.stop_received
    assert inbox.statistics().stop_delivered


async def test_stop_already_next_returns_at_once(autojump_clock):
    tx, inbox = open_inbox[int]()
    tx.stop()
    called: list[bool] = []

    async def source():
        called.append(True)

    with trio.testing.assert_checkpoints():
        assert await inbox.until_stop(source) is STOP
    assert called == []
    assert inbox.stop_received


async def test_stop_waits_behind_queued_messages(autojump_clock):
    # STOP is "next" only once the messages before it have been received.
    t0 = trio.current_time()
    tx, inbox = open_inbox[str](10)
    tx.send_nowait("job")
    tx.stop()

    async def other_reader():
        await trio.sleep(3)
        assert await inbox.receive() == "job"

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_reader)
        assert await inbox.until_stop(trio.sleep_forever) is STOP
    assert trio.current_time() - t0 == 3


async def test_item_and_stop_in_the_same_instant_loses_nothing(autojump_clock):
    source_tx, source_rx = trio.open_memory_channel[int](math.inf)
    tx, inbox = open_inbox[int]()
    got: list[object] = []

    async def consume():
        while (item := await inbox.until_stop(source_rx.receive)) is not STOP:
            got.append(item)
        got.append(item)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume)
        await trio.testing.wait_all_tasks_blocked()
        # the source delivers and STOP arrives without a checkpoint between
        source_tx.send_nowait(1)
        tx.stop()
    assert got == [1, STOP]


async def test_other_clone_taking_stop_wakes_this_one(autojump_clock):
    # Per-receiver STOP: when one clone takes STOP, it becomes next for the others.
    tx, inbox = open_inbox[int](10)
    other = inbox.clone()
    tx.send_nowait(1)
    tx.stop()

    async def drain():
        await trio.sleep(2)
        assert other.receive_nowait() == 1
        assert other.receive_nowait() is STOP

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        assert await inbox.until_stop(trio.sleep_forever) is STOP


async def test_closing_the_receiver_ends_the_wait(autojump_clock):
    _, inbox = open_inbox[int]()

    async def close_later():
        await trio.sleep(1)
        inbox.close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(close_later)
        with pytest.raises(trio.ClosedResourceError):
            await inbox.until_stop(trio.sleep_forever)
    with pytest.raises(trio.ClosedResourceError):
        await inbox.until_stop(trio.sleep_forever)


async def test_source_errors_propagate(autojump_clock):
    _, inbox = open_inbox[int]()

    async def broken():
        raise OSError("connection reset")

    with pytest.raises(OSError, match="connection reset"):
        await inbox.until_stop(broken)
    assert inbox.statistics().stop_requested is False


async def test_outer_cancellation_is_not_mistaken_for_stop(autojump_clock):
    _, inbox = open_inbox[int]()
    with trio.move_on_after(2) as scope:
        await inbox.until_stop(trio.sleep_forever)
    assert scope.cancelled_caught
    assert not inbox.stop_received


# -- a real server: stop accepting at once, let connections drain -------------


async def test_accept_loop_stops_at_once_while_connections_drain():
    served: list[bytes] = []

    async def handle(stream, conns):
        _, inbox = conns.open_inbox()
        async with stream:
            while True:
                data = await inbox.until_stop(stream.receive_some)
                if data is STOP or not data:
                    break
                await trio.sleep(0.05)  # work on the request
                await stream.send_all(b"done:" + data)
                served.append(data)
            if data is STOP:
                await stream.send_all(b"bye")

    async def server(inbox, *, task_status=trio.TASK_STATUS_IGNORED):
        async with open_bundle(name="connections") as conns:
            serve = functools.partial(
                trio.serve_tcp,
                functools.partial(handle, conns=conns),
                0,
                host="127.0.0.1",
                handler_nursery=conns,
                task_status=task_status,
            )
            assert await inbox.until_stop(serve) is STOP
            # the listener is closed now; the open connections finish up
            await conns.shutdown(grace=math.inf)

    async with trio.open_nursery() as outside, open_bundle(name="root") as root:
        _, inbox = root.open_inbox()
        listeners = await root.start(server, inbox)
        port = listeners[0].socket.getsockname()[1]
        client = await trio.open_tcp_stream("127.0.0.1", port)
        await client.send_all(b"req1")
        await trio.sleep(0.01)  # the request is in flight when shutdown begins

        async def shutdown():
            report = await root.shutdown(grace=30)
            assert report.graceful

        outside.start_soon(shutdown)
        # new connections are refused at once
        await trio.sleep(0.01)
        with pytest.raises(OSError, match="all attempts to connect"):
            await trio.open_tcp_stream("127.0.0.1", port)
        # the in-flight request is answered, then the server says goodbye
        received = b""
        while chunk := await client.receive_some():
            received += chunk
        assert received == b"done:req1bye"
        await client.aclose()
    assert served == [b"req1"]


# -- iter_until_stop: a source channel until STOP or its end ------------------


async def test_iteration_ends_at_the_end_of_the_source(autojump_clock):
    source_tx, source_rx = trio.open_memory_channel[str](math.inf)
    _, inbox = open_inbox[int]()
    for item in ("a", "b"):
        source_tx.send_nowait(item)
    source_tx.close()
    seen = [item async for item in inbox.iter_until_stop(source_rx)]
    assert seen == ["a", "b"]
    assert not inbox.stop_received


async def test_iteration_ends_at_stop_and_leaves_the_source_alone(autojump_clock):
    t0 = trio.current_time()
    source_tx, source_rx = trio.open_memory_channel[str](math.inf)
    tx, inbox = open_inbox[int]()
    seen: list[tuple[str, float]] = []

    async def feed() -> None:
        source_tx.send_nowait("first")
        await trio.sleep(1)
        source_tx.send_nowait("second")
        await trio.sleep(1)
        tx.stop()
        source_tx.send_nowait("unread")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(feed)
        async for item in inbox.iter_until_stop(source_rx):
            seen.append((item, trio.current_time() - t0))
    assert seen == [("first", 0), ("second", 1)]
    assert inbox.stop_received
    assert trio.current_time() - t0 == 2
    # nothing the source produced was lost
    assert source_rx.receive_nowait() == "unread"


async def test_iteration_over_real_stdin_lines_ends_at_eof():
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"one\ntwo\n")
        os.close(write_end)
        write_end = -1
        _, inbox = open_inbox[int]()
        async with open_stdin_lines(fd=read_end) as lines:
            seen = [line async for line in inbox.iter_until_stop(lines)]
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    assert seen == [b"one\n", b"two\n"]
    assert not inbox.stop_received


async def test_iteration_propagates_the_source_errors(autojump_clock):
    _, inbox = open_inbox[int]()
    _, source_rx = trio.open_memory_channel[int](0)
    source_rx.close()
    with pytest.raises(trio.ClosedResourceError):
        async for _ in inbox.iter_until_stop(source_rx):
            pass
