"""The lifecycle's transition table, driven exhaustively, h11-style.

Every (state, event) pair is tried: the legal ones move to the table's state,
the illegal ones raise and change nothing. The table itself is the test's
input, so a change to it is tested without editing this file.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections import deque

import pytest
import trio
import trio.testing
from hypothesis import given, strategies as st

from trio_graceful import (
    IllegalTransitionError,
    Lifecycle,
    LifecycleState,
    StateUnreachableError,
)
from trio_graceful._core import _statetable as statetable
from trio_graceful._run._program._lifecycle import (
    INITIAL_STATE,
    REACHABLE,
    TABLE,
    TRANSITIONS,
    LifecycleEvent,
)

S = LifecycleState


def new_lifecycle(name: str = "svc") -> Lifecycle:
    return Lifecycle._create(name)


def path_to(state: LifecycleState) -> list[LifecycleEvent]:
    """The shortest sequence of events from the initial state to ``state``."""
    paths: dict[LifecycleState, list[LifecycleEvent]] = {INITIAL_STATE: []}
    todo = deque([INITIAL_STATE])
    while todo:
        source = todo.popleft()
        for (from_state, event), target in TRANSITIONS.items():
            if from_state is source and target not in paths:
                paths[target] = [*paths[source], event]
                todo.append(target)
    return paths[state]


def lifecycle_in(state: LifecycleState) -> Lifecycle:
    lifecycle = new_lifecycle()
    for event in path_to(state):
        lifecycle._transition(event, f"on the way to {state.value}")
    assert lifecycle.state is state
    return lifecycle


def snapshot(lifecycle: Lifecycle) -> tuple[object, ...]:
    return (lifecycle.state, lifecycle.reason, lifecycle.changed_at)


# -- the table ------------------------------------------------------------------------


def test_every_state_is_reachable_from_the_initial_state():
    assert {INITIAL_STATE} | REACHABLE[INITIAL_STATE] == set(LifecycleState)


def test_shutdown_is_monotonic():
    assert REACHABLE[S.WITHDRAWN] == {S.SHUTTING_DOWN, S.TERMINATED}
    assert REACHABLE[S.SHUTTING_DOWN] == {S.TERMINATED}
    assert REACHABLE[S.TERMINATED] == set()
    for state in LifecycleState:
        assert S.UNINITIALIZED not in REACHABLE[state]
    # Every running state can shut down, and nothing else can end a run.
    assert {s for (s, e) in TRANSITIONS if e is LifecycleEvent.SHUT_DOWN} == {
        S.STARTING,
        S.READY,
        S.DEGRADED,
        S.WITHDRAWN,
    }
    # Only a program that took work is withdrawn from rotation first.
    assert {s for (s, e) in TRANSITIONS if e is LifecycleEvent.WITHDRAW} == {
        S.READY,
        S.DEGRADED,
    }
    assert [s for (s, t) in TRANSITIONS.items() if t is S.TERMINATED] == [
        (S.SHUTTING_DOWN, LifecycleEvent.TERMINATE)
    ]


LEGAL = sorted(TRANSITIONS, key=lambda pair: (pair[0].name, pair[1].name))
ILLEGAL = [
    pair
    for pair in itertools.product(LifecycleState, LifecycleEvent)
    if pair not in TRANSITIONS
]


def test_the_table_splits_every_pair():
    assert len(LEGAL) + len(ILLEGAL) == len(LifecycleState) * len(LifecycleEvent)
    assert len(LEGAL) == 12


async def test_ready_means_taking_new_work():
    assert {state for state in LifecycleState if lifecycle_in(state).ready} == {
        S.READY,
        S.DEGRADED,
    }


@pytest.mark.parametrize(
    ("state", "event"), LEGAL, ids=[f"{s.name}-{e.name}" for s, e in LEGAL]
)
async def test_legal_transition(autojump_clock, state, event):
    lifecycle = lifecycle_in(state)
    await trio.sleep(5)
    assert lifecycle._transition(event, "because") is TRANSITIONS[state, event]
    assert snapshot(lifecycle) == (
        TRANSITIONS[state, event],
        "because",
        trio.current_time(),
    )


@pytest.mark.parametrize(
    ("state", "event"), ILLEGAL, ids=[f"{s.name}-{e.name}" for s, e in ILLEGAL]
)
async def test_illegal_transition_raises_and_changes_nothing(state, event):
    lifecycle = lifecycle_in(state)
    before = snapshot(lifecycle)
    legal = " or ".join(s.value for s in TABLE.legal_sources(event))
    with pytest.raises(
        IllegalTransitionError,
        match=(
            rf"^lifecycle 'svc' cannot {event.value} while {state.value}; "
            rf"that is legal only while {legal}$"
        ),
    ):
        lifecycle._transition(event, "because")
    assert snapshot(lifecycle) == before


@given(st.lists(st.sampled_from(list(LifecycleEvent)), max_size=30))
def test_random_event_sequences_follow_the_table(events):
    async def drive() -> None:
        lifecycle = new_lifecycle()
        visited = [lifecycle.state]
        for event in events:
            expected = TRANSITIONS.get((lifecycle.state, event), lifecycle.state)
            with contextlib.suppress(IllegalTransitionError):
                lifecycle._transition(event, "")
            assert lifecycle.state is expected
            visited.append(lifecycle.state)
        # Once shutting down, never back.
        if S.SHUTTING_DOWN in visited:
            after = visited[visited.index(S.SHUTTING_DOWN) :]
            assert set(after) <= {S.SHUTTING_DOWN, S.TERMINATED}

    trio.run(drive)


# -- the public surface ---------------------------------------------------------------


async def test_degrade_and_recover(autojump_clock):
    lifecycle = lifecycle_in(S.READY)
    await trio.sleep(1)
    lifecycle.degrade("database unreachable")
    assert snapshot(lifecycle) == (S.DEGRADED, "database unreachable", 1)
    await trio.sleep(1)
    lifecycle.degrade("cache unreachable too")
    assert snapshot(lifecycle) == (S.DEGRADED, "cache unreachable too", 2)
    await trio.sleep(1)
    lifecycle.recover()
    assert snapshot(lifecycle) == (S.READY, "recovered", 3)
    lifecycle.degrade("again")
    lifecycle.recover("database is back")
    assert lifecycle.reason == "database is back"


async def test_degrade_while_shutting_down_raises():
    lifecycle = lifecycle_in(S.SHUTTING_DOWN)
    before = snapshot(lifecycle)
    with pytest.raises(
        IllegalTransitionError,
        match=(
            r"^lifecycle 'svc' cannot degrade while shutting down; "
            r"that is legal only while ready or degraded$"
        ),
    ):
        lifecycle.degrade("late failure")
    with pytest.raises(
        IllegalTransitionError,
        match=(
            r"^lifecycle 'svc' cannot recover while shutting down; "
            r"that is legal only while degraded$"
        ),
    ):
        lifecycle.recover()
    assert snapshot(lifecycle) == before


async def test_the_lifecycle_raises_the_one_error_of_every_state_table():
    lifecycle = lifecycle_in(S.TERMINATED)
    with pytest.raises(IllegalTransitionError) as caught:
        lifecycle.degrade("late failure")
    assert type(caught.value) is statetable.IllegalTransitionError
    assert IllegalTransitionError is statetable.IllegalTransitionError


async def test_reason_must_be_a_string():
    lifecycle = lifecycle_in(S.READY)
    with pytest.raises(TypeError, match=r"^reason must be a string, not 42$"):
        lifecycle.degrade(42)  # type: ignore[arg-type]
    assert lifecycle.state is S.READY


def test_transitions_need_a_trio_run():
    lifecycle = new_lifecycle()
    with pytest.raises(RuntimeError):
        lifecycle._transition(LifecycleEvent.START, "")
    assert snapshot(lifecycle) == (S.UNINITIALIZED, "", None)


def test_no_public_constructor():
    with pytest.raises(
        TypeError, match=r"^trio_graceful.Lifecycle has no public constructor$"
    ):
        Lifecycle("x")  # type: ignore[call-arg]


async def test_repr_and_name():
    lifecycle = lifecycle_in(S.DEGRADED)
    assert lifecycle.name == "svc"
    assert repr(lifecycle) == "<trio_graceful.Lifecycle 'svc' degraded>"


async def test_transitions_are_logged(caplog):
    caplog.set_level(logging.DEBUG, logger="trio_graceful.lifecycle")
    lifecycle = lifecycle_in(S.READY)
    lifecycle.degrade("disk full")
    lifecycle.recover("disk freed")
    lifecycle._transition(LifecycleEvent.SHUT_DOWN, "SIGTERM")
    lifecycle._transition(LifecycleEvent.TERMINATE, "")
    assert [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name == "trio_graceful.lifecycle"
    ] == [
        ("DEBUG", "svc: uninitialized -> starting (on the way to ready)"),
        ("DEBUG", "svc: starting -> ready (on the way to ready)"),
        ("WARNING", "svc: ready -> degraded (disk full)"),
        ("INFO", "svc: degraded -> ready (disk freed)"),
        ("DEBUG", "svc: ready -> shutting down (SIGTERM)"),
        ("DEBUG", "svc: shutting down -> terminated"),
    ]


# -- waiting for a state --------------------------------------------------------------


async def test_wait_state_returns_at_once_if_already_there():
    lifecycle = lifecycle_in(S.READY)
    with trio.testing.assert_checkpoints():
        await lifecycle.wait_state(S.READY)


async def test_wait_state_wakes_at_the_transition(autojump_clock):
    lifecycle = lifecycle_in(S.STARTING)
    woken: list[tuple[str, float]] = []

    async def waiter(state: LifecycleState) -> None:
        await lifecycle.wait_state(state)
        woken.append((state.value, trio.current_time()))

    async with trio.open_nursery() as nursery:
        for state in (S.READY, S.DEGRADED, S.TERMINATED):
            nursery.start_soon(waiter, state)
        await trio.sleep(1)
        lifecycle._transition(LifecycleEvent.BECOME_READY, "")
        await trio.sleep(1)
        lifecycle.degrade("x")
        await trio.sleep(1)
        lifecycle.recover()
        lifecycle._transition(LifecycleEvent.SHUT_DOWN, "")
        await trio.sleep(1)
        lifecycle._transition(LifecycleEvent.TERMINATE, "")
    assert sorted(woken, key=lambda w: w[1]) == [
        ("ready", 1),
        ("degraded", 2),
        ("terminated", 4),
    ]


async def test_wait_for_a_state_that_can_no_longer_be_reached():
    lifecycle = lifecycle_in(S.SHUTTING_DOWN)
    with pytest.raises(
        StateUnreachableError,
        match=r"^lifecycle 'svc' is shutting down and can no longer become ready$",
    ):
        await lifecycle.wait_state(S.READY)


async def test_wait_fails_when_the_state_becomes_unreachable(autojump_clock):
    lifecycle = lifecycle_in(S.STARTING)
    async with trio.open_nursery() as nursery:

        async def wait_degraded() -> None:
            with pytest.raises(
                StateUnreachableError,
                match=(
                    r"^lifecycle 'svc' is shutting down and can no longer "
                    r"become degraded$"
                ),
            ):
                await lifecycle.wait_state(S.DEGRADED)
            assert trio.current_time() == 3

        nursery.start_soon(wait_degraded)
        await trio.sleep(3)
        lifecycle._transition(LifecycleEvent.SHUT_DOWN, "startup failed")


async def test_wait_state_checks_its_argument():
    lifecycle = lifecycle_in(S.READY)
    with pytest.raises(
        TypeError, match=r"^state must be a LifecycleState, not 'ready'$"
    ):
        await lifecycle.wait_state("ready")  # type: ignore[arg-type]


async def test_wait_state_is_cancellable(autojump_clock):
    lifecycle = lifecycle_in(S.STARTING)
    with trio.move_on_after(5) as scope:
        await lifecycle.wait_state(S.READY)
    assert scope.cancelled_caught
    assert trio.current_time() == 5


async def test_a_state_entered_and_left_in_one_instant_still_wakes_its_waiters():
    lifecycle = lifecycle_in(S.STARTING)
    woken: list[str] = []

    async def waiter() -> None:
        await lifecycle.wait_state(S.READY)
        woken.append(lifecycle.state.value)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        lifecycle._transition(LifecycleEvent.BECOME_READY, "")
        lifecycle._transition(LifecycleEvent.SHUT_DOWN, "")
    assert woken == ["shutting down"]
