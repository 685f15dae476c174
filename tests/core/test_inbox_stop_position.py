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
from trio_graceful._core._inboxstate import InboxState
from trio_graceful._core._stopposition import (
    INITIAL_POSITION,
    REQUESTED,
    TRANSITIONS,
    StopEvent,
    StopPosition,
    StopPositionError,
    legal_sources,
    next_position,
)

_P = StopPosition
_E = StopEvent

ALL_PAIRS = list(itertools.product(StopPosition, StopEvent))
LEGAL = [pair for pair in ALL_PAIRS if pair in TRANSITIONS]
ILLEGAL = [pair for pair in ALL_PAIRS if pair not in TRANSITIONS]


def snapshot(state: InboxState[int]) -> dict[str, object]:
    return attrs.asdict(state, recurse=False) | {"stats": state.statistics()}


# -- the table ----------------------------------------------------------------


def test_the_table_is_what_the_rules_say():
    assert dict(TRANSITIONS) == {
        (_P.NONE, _E.REQUEST): _P.BEHIND_SENDERS,
        (_P.NONE, _E.REQUEST_FIRST): _P.REACHED,
        (_P.NONE, _E.END): _P.ENDED,
        (_P.BEHIND_SENDERS, _E.PASS_SENDERS): _P.IN_BUFFER,
        (_P.BEHIND_SENDERS, _E.END): _P.MOOT,
        (_P.IN_BUFFER, _E.REACH): _P.REACHED,
        (_P.IN_BUFFER, _E.END): _P.MOOT,
        (_P.REACHED, _E.END): _P.REACHED,
        (_P.ENDED, _E.REQUEST): _P.MOOT,
        (_P.ENDED, _E.REQUEST_FIRST): _P.MOOT,
        (_P.ENDED, _E.END): _P.ENDED,
        (_P.MOOT, _E.END): _P.MOOT,
    }
    assert INITIAL_POSITION is _P.NONE
    assert {p for p in StopPosition if p in REQUESTED} == {
        _P.BEHIND_SENDERS,
        _P.IN_BUFFER,
        _P.REACHED,
        _P.MOOT,
    }


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
    assert next_position(source, event) is TRANSITIONS[source, event]


@pytest.mark.parametrize(("source", "event"), ILLEGAL)
def test_every_illegal_transition_raises_and_changes_nothing(source, event):
    state = InboxState[int](3)
    state.position = source
    before = snapshot(state)
    legal = " or ".join(p.value for p in legal_sources(event))
    with pytest.raises(
        StopPositionError,
        match=rf"^STOP cannot {event.value} while {source.value}; "
        rf"that is legal only while {legal}$",
    ):
        state.apply(event)
    assert snapshot(state) == before


def test_legal_sources():
    assert legal_sources(_E.REACH) == (_P.IN_BUFFER,)
    assert legal_sources(_E.REQUEST) == (_P.NONE, _P.ENDED)
    assert legal_sources(_E.END) == (
        _P.NONE,
        _P.BEHIND_SENDERS,
        _P.IN_BUFFER,
        _P.REACHED,
        _P.ENDED,
        _P.MOOT,
    )


# -- the positions an inbox goes through --------------------------------------


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
