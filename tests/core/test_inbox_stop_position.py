"""The STOP position of an inbox: its table, and the state it leaves behind."""

from __future__ import annotations

import itertools
import math
import re
from decimal import Decimal

import attrs
import pytest
import trio
import trio.testing

from trio_graceful import STOP, open_bundle, open_inbox
from trio_graceful._core._inbox._shared import (
    INITIAL_POSITION,
    REQUESTED,
    TABLE,
    TRANSITIONS,
    InboxState,
    InboxStatistics,
    StopEvent,
    StopPosition,
)
from trio_graceful._core._statetable import IllegalTransitionError

_P = StopPosition
_E = StopEvent

ALL_PAIRS = list(itertools.product(StopPosition, StopEvent))
LEGAL = [pair for pair in ALL_PAIRS if pair in TRANSITIONS]
ILLEGAL = [pair for pair in ALL_PAIRS if pair not in TRANSITIONS]


def snapshot(state: InboxState[int]) -> dict[str, object]:
    return attrs.asdict(state, recurse=False) | {"stats": state.statistics()}


# -- the table ----------------------------------------------------------------


def test_every_position_is_reached_from_the_start_and_every_inbox_can_end():
    assert INITIAL_POSITION is _P.NONE
    assert TABLE.reachable([INITIAL_POSITION]) == set(StopPosition) - {_P.NONE}
    assert TABLE.legal_sources(_E.END) == tuple(StopPosition)
    # STOP is requested once it has been asked for, reached or not.
    requested = TABLE.reachable(
        TRANSITIONS[_P.NONE, event] for event in (_E.REQUEST, _E.REQUEST_FIRST)
    )
    assert (
        REQUESTED
        == requested | {_P.BEHIND_SENDERS}
        == {
            _P.BEHIND_SENDERS,
            _P.IN_BUFFER,
            _P.REACHED,
            _P.MOOT,
        }
    )


def test_stop_only_moves_forward():
    order = list(StopPosition)
    for (source, _), target in TRANSITIONS.items():
        if source in (_P.ENDED, _P.MOOT) or target in (_P.ENDED, _P.MOOT):
            continue
        assert order.index(target) >= order.index(source)
    # nothing leaves the end states but to record a request
    assert {t for (s, _), t in TRANSITIONS.items() if s is _P.MOOT} == {_P.MOOT}
    assert {t for (s, _), t in TRANSITIONS.items() if s is _P.REACHED} == {_P.REACHED}


@pytest.mark.parametrize(("source", "event"), LEGAL)
def test_every_legal_transition(source, event):
    state = InboxState[int](0)
    state.position = source
    state.apply(event)
    assert state.position is TRANSITIONS[source, event]
    assert TABLE.move(source, event, subject="STOP") is TRANSITIONS[source, event]


@pytest.mark.parametrize(("source", "event"), ILLEGAL)
def test_every_illegal_transition_raises_and_changes_nothing(source, event):
    state = InboxState[int](3)
    state.position = source
    before = snapshot(state)
    legal = " or ".join(p.value for p in TABLE.legal_sources(event))
    with pytest.raises(
        IllegalTransitionError,
        match=rf"^STOP cannot {event.value} while {source.value}; "
        rf"that is legal only while {legal}$",
    ):
        state.apply(event)
    assert snapshot(state) == before


def test_stop_is_reached_only_from_the_buffer_and_requested_only_before_or_after_it():
    assert TABLE.legal_sources(_E.REACH) == (_P.IN_BUFFER,)
    assert TABLE.legal_sources(_E.REQUEST) == (_P.NONE, _P.ENDED)
    assert TABLE.legal_sources(_E.END) == (
        _P.NONE,
        _P.BEHIND_SENDERS,
        _P.IN_BUFFER,
        _P.REACHED,
        _P.ENDED,
        _P.MOOT,
    )


# -- the positions an inbox goes through --------------------------------------


def test_each_change_to_the_queue_moves_stop_itself():
    # Driven by hand, with no task waiting: every method that changes the
    # queue moves STOP as far as it can go, and no caller has to ask.
    state = InboxState[int](2)
    sender, receiver = state.add_sender(), state.add_receiver()
    state.send_nowait(sender, 1)
    state.stop()
    # nobody was blocked in send: STOP went past them into the buffer
    assert state.position is _P.IN_BUFFER
    assert list(state.data) == [1, STOP]
    assert state.buffer_used() == 1
    assert state.receive_nowait(receiver) == 1
    assert state.stop_is_next(receiver)
    assert state.receive_nowait(receiver) is STOP
    assert state.position is _P.REACHED
    assert receiver.stop_seen
    assert not state.data
    state.close_sender(sender)
    with pytest.raises(trio.EndOfChannel):
        state.receive_nowait(receiver)
    assert state.position is _P.REACHED
    assert state.statistics() == InboxStatistics(
        current_buffer_used=0,
        max_buffer_size=2,
        open_send_channels=0,
        open_receive_channels=1,
        tasks_waiting_send=0,
        tasks_waiting_receive=0,
        peak_buffer_used=1,
        stop_requested=True,
        stop_delivered=True,
    )


def position(inbox: object) -> StopPosition:
    return inbox._state.position  # type: ignore[attr-defined]


async def test_behind_senders_then_in_buffer_then_reached(autojump_clock):
    tx, rx = open_inbox[str](1)
    tx.send_nowait("buffered")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tx.send, "blocked")
        await trio.testing.wait_all_tasks_blocked()
        assert position(rx) is _P.NONE
        tx.stop()
        assert position(rx) is _P.BEHIND_SENDERS
        assert rx.statistics().tasks_waiting_send == 1
        assert rx.receive_nowait() == "buffered"
        # the blocked sender moved in, and STOP behind it
        assert position(rx) is _P.IN_BUFFER
        assert rx.statistics().current_buffer_used == 1
        assert rx.statistics().tasks_waiting_send == 0
    assert rx.receive_nowait() == "blocked"
    assert position(rx) is _P.IN_BUFFER
    assert rx.receive_nowait() is STOP
    assert position(rx) is _P.REACHED
    assert rx.statistics().stop_delivered


async def test_a_cancelled_sender_lets_stop_pass(autojump_clock):
    tx, rx = open_inbox[str]()
    with trio.move_on_after(1):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tx.send, "given up")
            await trio.testing.wait_all_tasks_blocked()
            tx.stop()
            assert position(rx) is _P.BEHIND_SENDERS
    assert position(rx) is _P.IN_BUFFER
    assert rx.statistics().current_buffer_used == 0
    assert rx.receive_nowait() is STOP


async def test_waiting_receivers_get_stop_at_once(autojump_clock):
    tx, rx = open_inbox[int]()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rx.receive)
        await trio.testing.wait_all_tasks_blocked()
        tx.stop()
        assert position(rx) is _P.REACHED
    assert rx.stop_received


async def test_closing_the_last_receiver_makes_a_queued_stop_moot(autojump_clock):
    tx, rx = open_inbox[int](5)
    tx.send_nowait(1)
    tx.stop()
    rx.close()
    assert position(tx) is _P.MOOT
    stats = tx.statistics()
    # the queue was dropped, STOP with it
    assert stats.current_buffer_used == 0
    assert stats.stop_requested
    assert not stats.stop_delivered


async def test_stop_after_end_of_channel_is_moot(autojump_clock):
    async with open_bundle() as bundle:
        tx, rx = bundle.open_inbox()
        tx.close()
        with pytest.raises(trio.EndOfChannel):
            rx.receive_nowait()
        assert position(rx) is _P.ENDED
        assert not rx.statistics().stop_requested
        await bundle.shutdown(grace=0)
    assert position(rx) is _P.MOOT
    assert rx.statistics().stop_requested
    with pytest.raises(trio.EndOfChannel):
        rx.receive_nowait()
    assert not rx.stop_received


async def test_a_reached_stop_stays_reached_at_the_end(autojump_clock):
    tx, rx = open_inbox[int]()
    other = rx.clone()
    tx.stop()
    tx.close()
    assert rx.receive_nowait() is STOP
    with pytest.raises(trio.EndOfChannel):
        rx.receive_nowait()
    assert position(rx) is _P.REACHED
    # the other receiver still gets its own STOP first
    assert other.receive_nowait() is STOP
    with pytest.raises(trio.EndOfChannel):
        other.receive_nowait()


# -- arguments ----------------------------------------------------------------


@pytest.mark.parametrize(
    "size", [Decimal("Infinity"), Decimal(3), 3.0, -math.inf, float("nan"), None]
)
def test_buffer_sizes_that_are_not_int_or_inf(size):
    with pytest.raises(
        TypeError,
        match=rf"^max_buffer_size must be an int or math\.inf, not "
        rf"{re.escape(repr(size))}$",
    ):
        open_inbox(size)


@pytest.mark.parametrize("value", [1, 0, None, "yes"])
def test_stop_first_must_be_a_bool(value):
    with pytest.raises(
        TypeError, match=rf"^stop_first must be True or False, not {value!r}$"
    ):
        open_inbox(1, stop_first=value)


async def test_until_stop_needs_a_callable(autojump_clock):
    _, rx = open_inbox[int]()
    with pytest.raises(TypeError, match=r"^async_fn must be an async function, not 5$"):
        await rx.until_stop(5)  # type: ignore[arg-type]


def test_iter_until_stop_needs_a_channel():
    _, rx = open_inbox[int]()
    with pytest.raises(TypeError, match=r"^source must be a receive channel, not 5$"):
        rx.iter_until_stop(5)  # type: ignore[arg-type]
