"""Random interleavings of senders, stop(), receivers and cancellations.

Hypothesis picks the script (who sends what when, when stop() is called,
which operations are cancelled and when) and, through Trio's Hypothesis
integration, the order in which tasks that wake at the same instant run.
Times are small integers, so many operations coincide.
"""

from __future__ import annotations

import math

import attrs
import trio
import trio.testing
from hypothesis import given, settings, strategies as st

from trio_graceful import STOP, open_inbox

HANG = 10_000.0


@attrs.frozen
class Send:
    sender: int
    at: int
    cancel_after: int | None  # cancel the send if still blocked after this long


@attrs.frozen
class Script:
    buffer: int | float
    senders: int
    receivers: int
    sends: tuple[Send, ...]
    stop_at: int | None
    receive_gaps: tuple[tuple[int, ...], ...]  # per receiver: pauses between receives
    receive_timeouts: tuple[tuple[int | None, ...], ...]


@st.composite
def scripts(draw: st.DrawFn) -> Script:
    senders = draw(st.integers(1, 3))
    receivers = draw(st.integers(1, 3))
    sends = tuple(
        Send(
            draw(st.integers(0, senders - 1)),
            draw(st.integers(0, 6)),
            draw(st.one_of(st.none(), st.integers(0, 3))),
        )
        for _ in range(draw(st.integers(0, 12)))
    )
    gaps = tuple(
        tuple(draw(st.lists(st.integers(0, 3), min_size=1, max_size=6)))
        for _ in range(receivers)
    )
    # (a receive cancelled at once with no pause would spin without letting
    # the mock clock advance, so timeouts are at least 1)
    timeouts = tuple(
        tuple(
            draw(
                st.lists(
                    st.one_of(st.none(), st.integers(1, 2)), min_size=1, max_size=6
                )
            )
        )
        for _ in range(receivers)
    )
    return Script(
        buffer=draw(st.sampled_from([0, 1, 2, 3, math.inf])),
        senders=senders,
        receivers=receivers,
        sends=sends,
        stop_at=draw(st.one_of(st.none(), st.integers(0, 7))),
        receive_gaps=gaps,
        receive_timeouts=timeouts,
    )


@attrs.define
class Log:
    next_seq: int = 0
    completed: set[int] = attrs.field(factory=set[int])
    # the sequence number the next send would get when stop() was called
    stop_seq: int | None = None
    received: list[list[object]] = attrs.field(factory=list[list[object]])


async def play(script: Script) -> Log:
    log = Log(received=[[] for _ in range(script.receivers)])
    tx, rx = open_inbox[int](script.buffer)
    senders = [tx] + [tx.clone() for _ in range(script.senders - 1)]
    receivers = [rx] + [rx.clone() for _ in range(script.receivers - 1)]

    async def send_tracked(send: Send) -> None:
        await trio.sleep(send.at)
        seq = log.next_seq
        log.next_seq += 1
        with trio.CancelScope() as scope:
            if send.cancel_after is not None:
                scope.deadline = trio.current_time() + send.cancel_after
            await senders[send.sender].send(seq)
            # a send that returned delivered (or queued) its message
            log.completed.add(seq)

    async def stopper(at: int) -> None:
        await trio.sleep(at)
        log.stop_seq = log.next_seq
        with trio.testing.assert_no_checkpoints():
            tx.stop()

    async def receive_loop(index: int) -> None:
        receiver = receivers[index]
        gaps = script.receive_gaps[index]
        timeouts = script.receive_timeouts[index]
        step = 0
        while True:
            await trio.sleep(gaps[step % len(gaps)])
            timeout = timeouts[step % len(timeouts)]
            step += 1
            with trio.CancelScope() as scope:
                if timeout is not None:
                    scope.deadline = trio.current_time() + timeout
                try:
                    msg = await receiver.receive()
                except trio.EndOfChannel:
                    return
                log.received[index].append(msg)

    async def close_senders_when_done(send_tasks_done: trio.Event) -> None:
        await send_tasks_done.wait()
        for s in senders:
            await s.aclose()

    with trio.fail_after(HANG):
        async with trio.open_nursery() as nursery:
            for i in range(script.receivers):
                nursery.start_soon(receive_loop, i)
            done = trio.Event()
            nursery.start_soon(close_senders_when_done, done)
            if script.stop_at is not None:
                nursery.start_soon(stopper, script.stop_at)
            async with trio.open_nursery() as senders_nursery:
                for send in script.sends:
                    senders_nursery.start_soon(send_tracked, send)
            if script.stop_at is not None:
                # let the stopper run before the channel ends
                await trio.sleep(script.stop_at + 1)
            done.set()
    return log


def check(script: Script, log: Log) -> None:
    delivered = [m for msgs in log.received for m in msgs if m is not STOP]
    # nothing lost, nothing duplicated: exactly the sends that completed
    assert sorted(delivered) == sorted(log.completed)
    assert len(delivered) == len(set(delivered))
    for msgs in log.received:
        stops = [i for i, m in enumerate(msgs) if m is STOP]
        if script.stop_at is None:
            # no STOP for an inbox that was never stopped
            assert stops == []
            continue
        # every receiver that read to the end got exactly one STOP
        assert len(stops) == 1
        (at,) = stops
        assert log.stop_seq is not None
        # before its STOP a receiver sees only messages sent before stop();
        # after it, only messages sent later
        assert all(m < log.stop_seq for m in msgs[:at])
        assert all(m >= log.stop_seq for m in msgs[at + 1 :])
        # each receiver sees messages in the order they were sent
        plain = [m for m in msgs if m is not STOP]
        assert plain == sorted(plain)


@settings(max_examples=300)
@given(scripts())
def test_random_interleavings(script):
    log = trio.run(play, script, clock=trio.testing.MockClock(autojump_threshold=0))
    check(script, log)


@settings(max_examples=300)
@given(
    # narrow ranges: an item and STOP arriving in the same instant is the
    # case that matters
    st.lists(st.integers(0, 3), max_size=10),
    st.integers(0, 3),
    st.sampled_from([0, 1, math.inf]),
)
def test_until_stop_loses_nothing(arrivals, stop_at, buffer):
    """until_stop() over a cancel-safe source: every item is seen exactly once."""

    async def main() -> tuple[list[int], list[int], bool]:
        source_tx, source_rx = trio.open_memory_channel[int](math.inf)
        tx, inbox = open_inbox[int](buffer)
        during: list[int] = []
        stopped = False

        async def produce() -> None:
            for i, at in enumerate(sorted(arrivals)):
                await trio.sleep_until(at)
                source_tx.send_nowait(i)

        async def stop() -> None:
            await trio.sleep(stop_at)
            tx.stop()

        async def consume() -> None:
            nonlocal stopped
            while True:
                item = await inbox.until_stop(source_rx.receive)
                if item is STOP:
                    stopped = True
                    return
                during.append(item)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            nursery.start_soon(stop)
            nursery.start_soon(consume)
        after: list[int] = []
        while True:
            try:
                after.append(source_rx.receive_nowait())
            except trio.WouldBlock:
                break
        return during, after, stopped

    during, after, stopped = trio.run(
        main, clock=trio.testing.MockClock(autojump_threshold=0)
    )
    assert stopped
    assert during + after == list(range(len(arrivals)))
