"""Stopping early: STOP ahead of the queue, and what was queued handed back."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing
from hypothesis import given, settings, strategies as st

from trio_graceful import STOP, ChildOutcome, open_bundle, open_inbox


async def test_stop_first_goes_ahead_of_queued_messages(autojump_clock):
    tx, rx = open_inbox[str](5, stop_first=True)
    tx.send_nowait("a")
    tx.send_nowait("b")
    with trio.testing.assert_no_checkpoints():
        tx.stop()
    tx.send_nowait("after")
    assert rx.statistics().stop_delivered
    assert rx.receive_nowait() is STOP
    assert rx.drain_nowait() == ["a", "b", "after"]
    assert rx.drain_nowait() == []
    assert rx.statistics().current_buffer_used == 0


async def test_drain_takes_the_values_of_blocked_senders(autojump_clock):
    tx, rx = open_inbox[str](1, stop_first=True)
    tx.send_nowait("buffered")
    sent: list[str] = []

    async def send(msg: str) -> None:
        await tx.send(msg)
        sent.append(msg)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send, "w1")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(send, "w2")
        await trio.testing.wait_all_tasks_blocked()
        tx.stop()
        assert await rx.receive() is STOP
        with trio.testing.assert_no_checkpoints():
            assert rx.drain_nowait() == ["buffered", "w1", "w2"]
    # their sends completed: the values were handed over, not dropped
    assert sorted(sent) == ["w1", "w2"]
    assert rx.statistics().tasks_waiting_send == 0


async def test_each_clone_gets_stop_first(autojump_clock):
    tx, rx = open_inbox[int](10, stop_first=True)
    other = rx.clone()
    tx.send_nowait(1)
    tx.stop()
    assert other.receive_nowait() is STOP
    assert rx.drain_nowait() == []  # STOP is still next for rx
    assert rx.receive_nowait() is STOP
    assert rx.drain_nowait() == [1]


async def test_stop_first_wakes_until_stop_at_once(autojump_clock):
    t0 = trio.current_time()
    tx, rx = open_inbox[int](10, stop_first=True)
    tx.send_nowait(1)

    async def stop_later() -> None:
        await trio.sleep(2)
        tx.stop()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_later)
        assert await rx.until_stop(trio.sleep_forever) is STOP
    assert trio.current_time() - t0 == 2
    assert rx.drain_nowait() == [1]


async def test_drain_stops_before_a_stop_behind_the_queue(autojump_clock):
    tx, rx = open_inbox[int](10)
    tx.send_nowait(1)
    tx.stop()
    tx.send_nowait(2)
    assert rx.drain_nowait() == [1]
    assert rx.receive_nowait() is STOP
    assert rx.drain_nowait() == [2]


async def test_drain_of_a_closed_receiver(autojump_clock):
    _, rx = open_inbox[int](10)
    rx.close()
    with pytest.raises(trio.ClosedResourceError):
        rx.drain_nowait()


async def test_drain_does_not_end_the_channel(autojump_clock):
    tx, rx = open_inbox[int](10)
    tx.send_nowait(1)
    tx.close()
    assert rx.drain_nowait() == [1]
    assert rx.drain_nowait() == []
    with pytest.raises(trio.EndOfChannel):
        rx.receive_nowait()


# -- 30 queued jobs of 0.3 s, three workers, shutdown(grace=1) ----------------

JOBS = 30
JOB_SECONDS = 0.3


async def run_jobs(*, stop_first: bool) -> dict[str, object]:
    """Three workers share an inbox of 30 queued jobs; then shutdown(grace=1)."""
    t0 = trio.current_time()
    done: list[int] = []
    started: list[int] = []
    handed_back: list[int] = []

    async def worker(inbox) -> None:
        async for job in inbox:
            started.append(job)
            await trio.sleep(JOB_SECONDS)
            done.append(job)
        handed_back.extend(inbox.drain_nowait())

    async with open_bundle() as bundle:
        tx, jobs = open_inbox[int](math.inf, stop_first=stop_first)
        for job in range(JOBS):
            tx.send_nowait(job)
        for _ in range(3):
            bundle.start_soon(worker, jobs.clone())
        jobs.close()
        with bundle.on_stop(tx.stop):
            await trio.testing.wait_all_tasks_blocked()
            report = await bundle.shutdown(grace=1)
    return {
        "done": done,
        "started": started,
        "handed_back": handed_back,
        "report": report,
        "ended_at": trio.current_time(),
        "t0": t0,
    }


async def test_thirty_queued_jobs_stop_early_and_come_back(autojump_clock):
    result = await run_jobs(stop_first=True)
    # the three jobs in progress finish (in an order the scheduler picks);
    # the 27 others are handed back, in order
    assert sorted(result["done"]) == [0, 1, 2]
    assert result["handed_back"] == list(range(3, JOBS))
    report = result["report"]
    assert report.graceful
    assert report.count(ChildOutcome.FINISHED) == 3
    assert result["ended_at"] == result["t0"] + JOB_SECONDS


async def test_thirty_queued_jobs_by_default_wait_behind_the_queue(autojump_clock):
    # STOP waits behind the queue: at the grace's end three jobs are cut off
    # mid-job and eighteen never started (what stop_first=True is for).
    result = await run_jobs(stop_first=False)
    assert sorted(result["done"]) == list(range(9))
    assert sorted(result["started"]) == list(range(12))
    assert result["handed_back"] == []
    report = result["report"]
    assert not report.graceful
    assert report.count(ChildOutcome.CANCELLED) == 3
    assert result["ended_at"] == result["t0"] + 1


# -- random interleavings: stopping early loses nothing -----------------------


@settings(max_examples=200, deadline=None)
@given(
    buffer=st.sampled_from([0, 1, 3, math.inf]),
    receivers=st.integers(1, 3),
    sends=st.lists(
        st.tuples(st.integers(0, 5), st.one_of(st.none(), st.integers(0, 2))),
        max_size=10,
    ),
    stop_at=st.integers(0, 6),
)
def test_stop_first_and_drain_lose_nothing(buffer, receivers, sends, stop_at):
    async def main() -> None:
        tx, rx = open_inbox[int](buffer, stop_first=True)
        inboxes = [rx] + [rx.clone() for _ in range(receivers - 1)]
        completed: set[int] = set()
        got: list[int] = []
        # a global order of events: when stop() ran, when receive() was called
        clock = iter(range(10**6))
        stopped_at: list[int] = []
        overtaken: list[int] = []

        async def send(seq: int, at: int, cancel_after: int | None) -> None:
            await trio.sleep(at)
            with trio.CancelScope() as scope:
                if cancel_after is not None:
                    scope.deadline = trio.current_time() + cancel_after
                await tx.send(seq)
                completed.add(seq)

        async def stopper() -> None:
            await trio.sleep(stop_at)
            tx.stop()
            stopped_at.append(next(clock))

        async def receive(inbox) -> None:
            while True:
                called = next(clock)
                try:
                    msg = await inbox.receive()
                except trio.EndOfChannel:
                    return
                if msg is STOP:
                    got.extend(inbox.drain_nowait())
                    continue
                if not inbox.stop_received and stopped_at and called > stopped_at[0]:
                    # a receive called after stop() must have returned STOP
                    overtaken.append(msg)
                got.append(msg)

        async with trio.open_nursery() as nursery:
            for inbox in inboxes:
                nursery.start_soon(receive, inbox)
            nursery.start_soon(stopper)
            async with trio.open_nursery() as senders:
                for seq, (at, cancel_after) in enumerate(sends):
                    senders.start_soon(send, seq, at, cancel_after)
            await trio.sleep(stop_at + 1)
            tx.close()
        assert sorted(got) == sorted(completed)
        assert len(got) == len(set(got))
        assert all(inbox.stop_received for inbox in inboxes)
        assert overtaken == []

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
