"""Inboxes behave like Trio memory channels, plus an in-band STOP."""

from __future__ import annotations

import math
import pickle

import pytest
import trio
import trio.testing

from trio_graceful import (
    STOP,
    InboxReceiver,
    InboxSender,
    InboxStatistics,
    StopType,
    open_bundle,
    open_inbox,
)

# -- the STOP sentinel --------------------------------------------------------


def test_stop_sentinel():
    assert repr(STOP) == "trio_graceful.STOP"
    assert str(STOP) == "STOP"
    assert STOP is StopType.STOP
    assert list(StopType) == [STOP]
    assert bool(STOP)
    assert pickle.loads(pickle.dumps(STOP)) is STOP


# -- memory-channel parity ----------------------------------------------------


async def test_fifo_and_buffer(autojump_clock):
    tx, rx = open_inbox[int](2)
    tx.send_nowait(1)
    tx.send_nowait(2)
    with pytest.raises(trio.WouldBlock):
        tx.send_nowait(3)
    assert rx.receive_nowait() == 1
    assert await rx.receive() == 2
    with pytest.raises(trio.WouldBlock):
        rx.receive_nowait()


async def test_unbuffered_send_waits_for_receiver(autojump_clock):
    tx, rx = open_inbox[str]()
    done: list[float] = []

    async def sender():
        await tx.send("x")
        done.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        await trio.sleep(3)
        assert done == []
        assert rx.statistics().tasks_waiting_send == 1
        assert await rx.receive() == "x"
    assert done == [3]


async def test_infinite_buffer(autojump_clock):
    tx, rx = open_inbox[int](math.inf)
    for i in range(1000):
        tx.send_nowait(i)
    assert [rx.receive_nowait() for _ in range(1000)] == list(range(1000))


@pytest.mark.parametrize(
    ("size", "error", "message"),
    [
        (-1, ValueError, r"^max_buffer_size must be >= 0, not -1$"),
        (
            1.5,
            TypeError,
            r"^max_buffer_size must be an int or math\.inf, not 1\.5$",
        ),
        ("3", TypeError, r"^max_buffer_size must be an int or math\.inf, not '3'$"),
        (
            True,
            TypeError,
            r"^max_buffer_size must be an int or math\.inf, not True$",
        ),
    ],
)
def test_bad_buffer_size(size, error, message):
    with pytest.raises(error, match=message):
        open_inbox(size)


async def test_close_sender_ends_channel_after_drain(autojump_clock):
    tx, rx = open_inbox[int](5)
    tx.send_nowait(1)
    tx.close()
    assert await rx.receive() == 1
    with pytest.raises(trio.EndOfChannel):
        await rx.receive()
    with pytest.raises(trio.ClosedResourceError):
        await tx.send(2)
    with pytest.raises(trio.ClosedResourceError):
        tx.send_nowait(2)
    tx.close()  # twice is fine


async def test_waiting_receivers_get_end_of_channel(autojump_clock):
    tx, rx = open_inbox[int]()

    async def wait_end():
        with pytest.raises(trio.EndOfChannel):
            await rx.receive()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_end)
        nursery.start_soon(wait_end)
        await trio.testing.wait_all_tasks_blocked()
        await tx.aclose()


async def test_closing_receivers_breaks_senders(autojump_clock):
    tx, rx = open_inbox[int]()

    async def blocked_send():
        with pytest.raises(trio.BrokenResourceError):
            await tx.send(1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(blocked_send)
        await trio.testing.wait_all_tasks_blocked()
        await rx.aclose()
    with pytest.raises(trio.BrokenResourceError):
        tx.send_nowait(2)
    with pytest.raises(trio.ClosedResourceError):
        rx.receive_nowait()
    with pytest.raises(trio.ClosedResourceError):
        await rx.receive()


async def test_closing_an_object_wakes_its_own_waiters(autojump_clock):
    tx, rx = open_inbox[int]()
    rx2 = rx.clone()
    tx2 = tx.clone()

    async def receive_closed(r):
        with pytest.raises(trio.ClosedResourceError):
            await r.receive()

    async def send_closed(s):
        with pytest.raises(trio.ClosedResourceError):
            await s.send(1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receive_closed, rx2)
        await trio.testing.wait_all_tasks_blocked()
        rx2.close()
    tx2.send_nowait  # noqa: B018 - the clone is usable
    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_closed, tx2)
        await trio.testing.wait_all_tasks_blocked()
        tx2.close()
    # the originals still work
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tx.send, 5)
        assert await rx.receive() == 5


async def test_clones_share_one_queue_and_close_it_with_the_last_one(autojump_clock):
    tx, rx = open_inbox[int](10)
    tx2 = tx.clone()
    rx2 = rx.clone()
    tx.send_nowait(1)
    tx2.send_nowait(2)
    assert rx2.receive_nowait() == 1
    assert rx.receive_nowait() == 2
    tx.close()
    tx2.send_nowait(3)
    tx2.close()
    assert rx.receive_nowait() == 3
    with pytest.raises(trio.EndOfChannel):
        rx2.receive_nowait()
    rx.close()
    with pytest.raises(trio.ClosedResourceError):
        rx.clone()
    with pytest.raises(trio.ClosedResourceError):
        tx.clone()


async def test_context_managers_close(autojump_clock):
    tx, rx = open_inbox[int](1)
    with tx, rx:
        pass
    assert tx.statistics().open_send_channels == 0
    assert rx.statistics().open_receive_channels == 0
    tx, rx = open_inbox[int](1)
    async with tx, rx:
        pass
    assert rx.statistics().open_receive_channels == 0


async def test_send_and_receive_are_checkpoints(autojump_clock):
    tx, rx = open_inbox[int](1)
    with trio.testing.assert_checkpoints():
        await tx.send(1)
    with trio.testing.assert_checkpoints():
        await rx.receive()
    with trio.testing.assert_no_checkpoints():
        tx.stop()
    with trio.testing.assert_checkpoints():
        await rx.receive()


async def test_cancelled_receive_loses_nothing(autojump_clock):
    tx, rx = open_inbox[int]()
    with trio.move_on_after(1):
        await rx.receive()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tx.send, 7)
        assert await rx.receive() == 7


async def test_no_public_constructors():
    tx, rx = open_inbox[int]()
    with pytest.raises(TypeError, match="no public constructor"):
        InboxSender(None)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="no public constructor"):
        InboxReceiver(None, None)  # type: ignore[call-arg]
    assert "inbox sender" in repr(tx)
    assert "inbox receiver" in repr(rx)


# -- STOP ---------------------------------------------------------------------


async def test_stop_is_delivered_after_queued_messages(autojump_clock):
    tx, rx = open_inbox[str](3)
    tx.send_nowait("a")
    tx.send_nowait("b")
    tx.stop()
    tx.send_nowait("after")
    assert [rx.receive_nowait() for _ in range(4)] == ["a", "b", STOP, "after"]
    assert rx.stop_received


async def test_stop_never_blocks_on_a_full_buffer(autojump_clock):
    tx, rx = open_inbox[str](1)
    tx.send_nowait("buffered")
    waiting_done: list[str] = []

    async def waiting_sender(msg):
        await tx.send(msg)
        waiting_done.append(msg)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiting_sender, "w1")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(waiting_sender, "w2")
        await trio.testing.wait_all_tasks_blocked()
        with trio.testing.assert_no_checkpoints():
            tx.stop()
        nursery.start_soon(waiting_sender, "late")
        await trio.testing.wait_all_tasks_blocked()
        stats = rx.statistics()
        assert stats.tasks_waiting_send == 3
        assert stats.stop_requested
        assert not stats.stop_delivered
        got = [await rx.receive() for _ in range(5)]
    assert got == ["buffered", "w1", "w2", STOP, "late"]
    assert rx.statistics().stop_delivered


async def test_stop_on_unbuffered_inbox(autojump_clock):
    tx, rx = open_inbox[int]()
    tx.stop()
    assert rx.statistics().current_buffer_used == 0
    assert await rx.receive() is STOP


async def test_repeated_stop_delivers_one(autojump_clock):
    tx, rx = open_inbox[int](10)
    tx.stop()
    tx.clone().stop()
    tx.stop()
    tx.send_nowait(1)
    assert rx.receive_nowait() is STOP
    assert rx.receive_nowait() == 1
    with pytest.raises(trio.WouldBlock):
        rx.receive_nowait()


async def test_stop_wakes_waiting_receivers_of_every_clone(autojump_clock):
    tx, rx = open_inbox[int]()
    rx2 = rx.clone()
    same_object_second_task: list[object] = []
    got: dict[str, object] = {}

    async def receive(name, r):
        got[name] = await r.receive()

    async def second_on_rx():
        same_object_second_task.append(await rx.receive())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receive, "rx", rx)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(receive, "rx2", rx2)
        nursery.start_soon(second_on_rx)
        await trio.testing.wait_all_tasks_blocked()
        tx.stop()
        await trio.testing.wait_all_tasks_blocked()
        assert got == {"rx": STOP, "rx2": STOP}
        # one STOP per receiver object: the second task on rx keeps waiting
        assert same_object_second_task == []
        await tx.send(9)
    assert same_object_second_task == [9]


async def test_each_clone_gets_stop_once(autojump_clock):
    tx, rx = open_inbox[int](10)
    workers = [rx.clone() for _ in range(3)]
    tx.send_nowait(1)
    tx.stop()
    tx.send_nowait(2)
    assert workers[0].receive_nowait() == 1
    assert workers[1].receive_nowait() is STOP
    assert workers[0].receive_nowait() is STOP  # before the post-stop message
    assert workers[2].receive_nowait() is STOP
    assert workers[0].receive_nowait() == 2
    assert rx.receive_nowait() is STOP
    late_clone = workers[0].clone()
    assert late_clone.stop_received
    with pytest.raises(trio.WouldBlock):
        late_clone.receive_nowait()


async def test_async_for_ends_at_stop(autojump_clock):
    tx, rx = open_inbox[int](10)
    for i in range(3):
        tx.send_nowait(i)
    tx.stop()
    tx.send_nowait(99)
    seen = [msg async for msg in rx]
    assert seen == [0, 1, 2]
    assert rx.stop_received
    # a worker in its shutdown phase can keep reading
    assert await rx.receive() == 99


async def test_async_for_ends_at_end_of_channel(autojump_clock):
    tx, rx = open_inbox[int](10)
    tx.send_nowait(1)
    tx.close()
    seen = [msg async for msg in rx]
    assert seen == [1]
    assert not rx.stop_received


async def test_stop_then_close_gives_stop_then_end(autojump_clock):
    tx, rx = open_inbox[int](10)
    tx.send_nowait(1)
    tx.stop()
    tx.close()
    assert rx.receive_nowait() == 1
    assert rx.receive_nowait() is STOP
    with pytest.raises(trio.EndOfChannel):
        rx.receive_nowait()


async def test_stop_errors(autojump_clock):
    tx, rx = open_inbox[int]()
    with pytest.raises(
        ValueError, match=r"^STOP cannot be sent as a message; call stop\(\) instead$"
    ):
        tx.send_nowait(STOP)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="STOP cannot be sent"):
        await tx.send(STOP)  # type: ignore[arg-type]
    tx2 = tx.clone()
    tx2.close()
    with pytest.raises(trio.ClosedResourceError):
        tx2.stop()
    rx.close()
    with pytest.raises(trio.BrokenResourceError):
        tx.stop()


async def test_statistics_count_stop_as_taking_no_room_until_delivered(autojump_clock):
    tx, rx = open_inbox[int](2)
    tx.send_nowait(1)
    tx.stop()
    assert rx.statistics() == InboxStatistics(
        current_buffer_used=1,  # STOP takes no room
        max_buffer_size=2,
        open_send_channels=1,
        open_receive_channels=1,
        tasks_waiting_send=0,
        tasks_waiting_receive=0,
        peak_buffer_used=1,
        stop_requested=True,
        stop_delivered=False,
    )
    tx.send_nowait(2)
    with pytest.raises(trio.WouldBlock):
        tx.send_nowait(3)
    assert [rx.receive_nowait() for _ in range(3)] == [1, STOP, 2]
    assert tx.statistics().stop_delivered
    assert tx.statistics().current_buffer_used == 0


async def test_no_stop_without_stop(autojump_clock):
    tx, rx = open_inbox[int](10)
    for i in range(5):
        tx.send_nowait(i)
    tx.close()
    assert [m async for m in rx] == list(range(5))
    assert not rx.stop_received
    assert not rx.statistics().stop_requested


# -- inboxes of a bundle ------------------------------------------------------


async def test_shutdown_stops_every_inbox_then_cancels(autojump_clock):
    t0 = trio.current_time()
    log: list[tuple[str, object, float]] = []

    async def worker(name, inbox):
        async for job in inbox:
            await trio.sleep(1)
            log.append((name, job, trio.current_time() - t0))
        log.append((name, "stopped", trio.current_time() - t0))

    async with open_bundle() as bundle:
        senders = []
        for name in ("a", "b"):
            tx, rx = bundle.open_inbox(10)
            senders.append(tx)
            bundle.start_soon(worker, name, rx)
        for tx in senders:
            tx.send_nowait(1)
            tx.send_nowait(2)
        report = await bundle.shutdown(grace=10)
    for name in ("a", "b"):
        assert [entry for entry in log if entry[0] == name] == [
            (name, 1, 1),
            (name, 2, 2),
            (name, "stopped", 2),
        ]
    assert report.elapsed == 2
    assert report.graceful


async def test_inbox_opened_during_shutdown_is_stopped_at_once(autojump_clock):
    async with open_bundle() as bundle:
        _, rx = bundle.open_inbox()

        async def late_opener():
            await trio.sleep(1)
            _, late_rx = bundle.open_inbox()
            assert await late_rx.receive() is STOP

        bundle.start_soon(late_opener)
        bundle.start_soon(rx.receive)
        await bundle.shutdown(grace=5)
        assert bundle.closed


async def test_bundle_forgets_inboxes_whose_receivers_closed(autojump_clock):
    async with open_bundle() as bundle:
        for _ in range(10):
            _, rx = bundle.open_inbox()
            rx.close()
        _, rx = bundle.open_inbox()
        assert bundle.statistics().inboxes == 1
        await bundle.shutdown(grace=0)
        assert rx.receive_nowait() is STOP


async def test_bundle_stop_reaches_inbox_with_no_open_sender(autojump_clock):
    async with open_bundle() as bundle:
        tx, rx = bundle.open_inbox()
        tx.close()  # the worker only waits for STOP
        bundle.start_soon(rx.receive)
        report = await bundle.shutdown(grace=5)
    assert report.graceful
    assert rx.stop_received


async def test_nested_shutdown_composes(autojump_clock):
    # A child that gets STOP shuts down its own bundle with its own grace;
    # the outer deadline still bounds it.
    t0 = trio.current_time()
    ends: dict[str, float] = {}

    async def leaf(name, inbox):
        msg = await inbox.receive()
        assert msg is STOP
        await trio.sleep(30)  # a slow goodbye
        ends[name] = trio.current_time() - t0

    async def middle(inbox):
        async with open_bundle(name="middle") as inner:
            for i in range(3):
                _, rx = inner.open_inbox()
                inner.start_soon(leaf, f"leaf{i}", rx)
            assert await inbox.receive() is STOP
            await inner.shutdown(grace=20)

    async with open_bundle(name="outer") as outer:
        _, rx = outer.open_inbox()
        outer.start_soon(middle, rx)
        await trio.testing.wait_all_tasks_blocked()
        report = await outer.shutdown(grace=10)
    assert trio.current_time() - t0 == 10
    assert ends == {}
    assert report.children[0].outcome.name == "CANCELLED"
