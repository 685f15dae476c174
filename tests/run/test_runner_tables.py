"""The runner's tables, driven synchronously: stages, escalation, exit status,
and the collector's counted deferral.

Each table is checked whole: every legal move and every illegal one (which
raises and changes nothing, the lifecycle included), every escalation step
done exactly once by each observer, and the exit status of every kind of
ending.
"""

from __future__ import annotations

import gc
import signal
from collections.abc import Iterator

import pytest
from hypothesis import given, strategies as st

from trio_graceful import ExitCodes, IllegalTransitionError, Lifecycle, LifecycleState
from trio_graceful._run._exit._status import Ending, exit_reason, exit_status
from trio_graceful._run._program._lifecycle import LifecycleEvent
from trio_graceful._run._shutdown._gcdeferral import NO_FULL_COLLECTIONS, GcHold
from trio_graceful._run._shutdown._stages import (
    FORCED,
    LIFECYCLE_EVENTS,
    ROOT_CLOSED,
    SHUTTING_DOWN,
    STAGES,
    TABLE,
    IllegalMoveError,
    Move,
    Stage,
    Stages,
)
from trio_graceful._run._signals._escalation import (
    ESCALATION,
    Escalation,
    Observer,
    Step,
)

# -- stages ---------------------------------------------------------------------------


def ready_stages() -> tuple[Stages, list[tuple[LifecycleEvent, LifecycleState]]]:
    """A Stages object of a program that has started and is ready, and the
    list of the lifecycle transitions it reports from then on."""
    lifecycle = Lifecycle._create("p")  # pyright: ignore[reportPrivateUsage]
    transitions: list[tuple[LifecycleEvent, LifecycleState]] = []
    stages = Stages(lifecycle, lambda *transition: transitions.append(transition))
    stages.start()
    stages.become_ready()
    assert transitions == [
        (LifecycleEvent.START, LifecycleState.UNINITIALIZED),
        (LifecycleEvent.BECOME_READY, LifecycleState.STARTING),
    ]
    assert lifecycle.state is LifecycleState.READY
    transitions.clear()
    return stages, transitions


# The lifecycle state of a ready program at each stage: derived, never moved
# beside the stage.
LIFECYCLE_AT: dict[Stage, LifecycleState] = {
    Stage.RUNNING: LifecycleState.READY,
    Stage.WITHDRAWN: LifecycleState.WITHDRAWN,
    **dict.fromkeys(SHUTTING_DOWN, LifecycleState.SHUTTING_DOWN),
}


def at(stage: Stage) -> Stages:
    """A Stages object driven to ``stage`` along legal moves."""
    paths = {
        Stage.RUNNING: [],
        Stage.WITHDRAWN: [Move.WITHDRAW],
        Stage.DRAINING_ROOT: [Move.SHUT_DOWN],
        Stage.FORCED_ROOT: [Move.SHUT_DOWN, Move.FORCE],
        Stage.DRAINING_SERVICES: [Move.SHUT_DOWN, Move.ROOT_CLOSED],
        Stage.FORCED_SERVICES: [Move.SHUT_DOWN, Move.FORCE, Move.ROOT_CLOSED],
        Stage.ENDED: [Move.SHUT_DOWN, Move.ROOT_CLOSED, Move.SERVICES_CLOSED],
        Stage.ENDED_FORCED: [
            Move.SHUT_DOWN,
            Move.ROOT_CLOSED,
            Move.FORCE,
            Move.SERVICES_CLOSED,
        ],
    }
    stages, _ = ready_stages()
    for move in paths[stage]:
        stages.move(move)
    assert stages.stage is stage
    assert stages.lifecycle.state is LIFECYCLE_AT[stage]
    return stages


@pytest.mark.parametrize("stage", list(Stage))
@pytest.mark.parametrize("move", list(Move))
async def test_every_move_from_every_stage(stage, move):
    stages = at(stage)
    target = STAGES.get((stage, move))
    if target is None:
        legal = " or ".join(s.value for s in TABLE.legal_sources(move))
        with pytest.raises(
            IllegalMoveError,
            match=(
                rf"^the runner cannot {move.value} while {stage.value}; "
                rf"that is legal only while {legal}$"
            ),
        ):
            stages.move(move)
        assert stages.stage is stage
        assert stages.lifecycle.state is LIFECYCLE_AT[stage]
    else:
        assert stages.move(move) is target
        assert stages.stage is target
        assert stages.lifecycle.state is LIFECYCLE_AT[target]


async def test_an_illegal_move_is_an_illegal_transition():
    assert issubclass(IllegalMoveError, IllegalTransitionError)
    with pytest.raises(IllegalTransitionError):
        at(Stage.ENDED).move(Move.FORCE)


async def test_the_stages_are_the_lifecycles_one_writer():
    assert dict(LIFECYCLE_EVENTS) == {
        Move.WITHDRAW: LifecycleEvent.WITHDRAW,
        Move.SHUT_DOWN: LifecycleEvent.SHUT_DOWN,
    }
    stages, transitions = ready_stages()
    stages.move(Move.WITHDRAW, "SIGTERM")
    assert (stages.lifecycle.state, stages.lifecycle.reason) == (
        LifecycleState.WITHDRAWN,
        "SIGTERM",
    )
    stages.move(Move.SHUT_DOWN, "after the drain delay")
    stages.move(Move.FORCE)
    stages.move(Move.ROOT_CLOSED)
    stages.move(Move.SERVICES_CLOSED)
    # Each move the lifecycle sees is one transition, reported once; the
    # others leave it alone.
    assert transitions == [
        (LifecycleEvent.WITHDRAW, LifecycleState.READY),
        (LifecycleEvent.SHUT_DOWN, LifecycleState.WITHDRAWN),
    ]
    assert stages.lifecycle.reason == "after the drain delay"
    stages.terminate("exit status 0")
    assert stages.lifecycle.state is LifecycleState.TERMINATED
    assert transitions[-1] == (LifecycleEvent.TERMINATE, LifecycleState.SHUTTING_DOWN)


async def test_readiness_after_the_shutdown_began_leaves_the_lifecycle_alone():
    lifecycle = Lifecycle._create("p")  # pyright: ignore[reportPrivateUsage]
    stages = Stages(lifecycle, lambda event, source: None)
    stages.start()
    stages.move(Move.SHUT_DOWN, "SIGINT")
    stages.become_ready()  # main called started() as its startup was cancelled
    assert lifecycle.state is LifecycleState.SHUTTING_DOWN


async def test_what_each_stage_means():
    assert set(Stage) - {Stage.RUNNING, Stage.WITHDRAWN} == SHUTTING_DOWN
    assert {Stage.FORCED_ROOT, Stage.FORCED_SERVICES, Stage.ENDED_FORCED} == FORCED
    assert {
        Stage.DRAINING_SERVICES,
        Stage.FORCED_SERVICES,
        Stage.ENDED,
        Stage.ENDED_FORCED,
    } == ROOT_CLOSED
    for stage in Stage:
        stages = at(stage)
        assert stages.shutting_down == (stage in SHUTTING_DOWN)
        assert stages.forced == (stage in FORCED)
        assert stages.root_closed == (stage in ROOT_CLOSED)


def test_the_drain_delay_comes_only_before_the_drain():
    assert {pair for pair in STAGES if pair[1] is Move.WITHDRAW} == {
        (Stage.RUNNING, Move.WITHDRAW)
    }
    assert [move for (stage, move) in STAGES if stage is Stage.WITHDRAWN] == [
        Move.SHUT_DOWN
    ]


def test_forcing_is_kept_to_the_end_and_nothing_leaves_an_end():
    for (source, _), target in STAGES.items():
        if source in FORCED:
            assert target in FORCED
    ends = {Stage.ENDED, Stage.ENDED_FORCED}
    assert not [pair for pair in STAGES if pair[0] in ends]


# -- escalation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "steps"),
    [
        ("force", [Step.SHUT_DOWN, Step.FORCE, Step.EMERGENCY]),
        ("exit", [Step.SHUT_DOWN, Step.EXIT_NOW]),
    ],
)
def test_each_signal_takes_the_next_step_of_its_mode(mode, steps):
    escalation = Escalation(mode)
    taken = [escalation.record(Observer.TRIO, signal.SIGINT) for _ in steps]
    assert taken == [(step,) for step in steps]
    assert escalation.level == len(steps)


def test_a_signal_seen_by_both_observers_counts_once():
    escalation = Escalation("force")
    assert escalation.record(Observer.TRIO, signal.SIGINT) == (Step.SHUT_DOWN,)
    assert escalation.record(Observer.WATCHDOG, signal.SIGINT) == (Step.SHUT_DOWN,)
    assert escalation.level == 1
    assert not escalation.behind(Observer.TRIO)
    assert escalation.record(Observer.WATCHDOG, signal.SIGTERM) == (Step.FORCE,)
    assert escalation.behind(Observer.TRIO)
    # CPython called the Python handler once for both: the Trio thread
    # catches up on what the watchdog saw.
    assert escalation.catch_up(Observer.TRIO) == (Step.FORCE,)
    assert escalation.record(Observer.TRIO, signal.SIGTERM) == ()
    assert escalation.level == 2
    assert (escalation.first_signal, escalation.last_signal) == (2, 15)


def test_early_signals_count_for_both_observers():
    escalation = Escalation("exit")
    escalation.record_early(signal.SIGTERM)
    assert escalation.catch_up(Observer.TRIO) == (Step.SHUT_DOWN,)
    assert escalation.record(Observer.WATCHDOG, signal.SIGINT) == (
        Step.SHUT_DOWN,
        Step.EXIT_NOW,
    )
    assert escalation.first_signal == signal.SIGTERM


def test_signals_past_the_end_of_the_table_do_nothing_more():
    escalation = Escalation("exit")
    for _ in range(2):
        escalation.record(Observer.TRIO, signal.SIGINT)
    assert escalation.record(Observer.TRIO, signal.SIGINT) == ()
    assert escalation.behind(Observer.WATCHDOG)  # it saw none of them yet


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[str, list[Observer]]:
    """n signals: the watchdog sees each; the Trio thread sees some, merged."""
    mode = draw(st.sampled_from(["force", "exit"]))
    n = draw(st.integers(1, 5))
    trio_sees = draw(st.integers(1, n))
    events = [Observer.WATCHDOG] * n + [Observer.TRIO] * trio_sees
    return mode, draw(st.permutations(events))


@given(deliveries())
def test_each_observer_does_each_step_once_in_order(case):
    mode, events = case
    escalation = Escalation(mode)  # type: ignore[arg-type]
    done: dict[Observer, list[Step]] = {o: [] for o in Observer}
    for observer in events:
        done[observer] += escalation.record(observer, signal.SIGINT)
    done[Observer.TRIO] += escalation.catch_up(Observer.TRIO)
    signals = events.count(Observer.WATCHDOG)
    expected = list(ESCALATION[mode][:signals])
    assert done == {Observer.TRIO: expected, Observer.WATCHDOG: expected}
    assert escalation.level == signals


# -- exit status ----------------------------------------------------------------------

CODES = ExitCodes(ok=10, error=11, startup_failed=12, emergency=99)
LENIENT = ExitCodes(clean_after_grace=True)
INT, TERM = signal.SIGINT, signal.SIGTERM

EXIT_STATUS_TABLE = [
    # (codes, ending, status)
    (CODES, Ending(), 10),
    (CODES, Ending(failure="error"), 11),
    (CODES, Ending(failure="startup"), 12),
    (CODES, Ending(failure="error", system_exit=(3,), first_signal=INT), 11),
    (CODES, Ending(system_exit=(3,), first_signal=INT, forced_by="signal"), 3),
    (CODES, Ending(system_exit=(None,)), 10),
    (CODES, Ending(system_exit=("usage",)), 11),
    (CODES, Ending(first_signal=TERM), 10),
    (CODES, Ending(first_signal=TERM, forced_by="grace"), 143),
    (CODES, Ending(first_signal=TERM, forced_by="signal"), 143),
    (CODES, Ending(first_signal=INT), 130),
    (CODES, Ending(first_signal=INT, forced_by="signal"), 130),
    (CODES, Ending(forced_by="grace"), 10),
    (LENIENT, Ending(first_signal=TERM, forced_by="grace"), 0),
    (LENIENT, Ending(first_signal=TERM, forced_by="signal"), 143),
    (LENIENT, Ending(first_signal=INT, forced_by="grace"), 130),
]


@pytest.mark.parametrize(("codes", "ending", "status"), EXIT_STATUS_TABLE)
def test_exit_status(codes, ending, status):
    assert exit_status(codes, ending) == status


EXIT_REASON_TABLE = [
    (Ending(), None),
    (Ending(failure="error"), "error"),
    (Ending(failure="startup", first_signal=INT), "startup failed"),
    (Ending(system_exit=(3,), first_signal=INT), "SystemExit(3)"),
    (Ending(system_exit=("usage",)), "SystemExit('usage')"),
    (Ending(first_signal=TERM), "SIGTERM"),
    (Ending(first_signal=INT), "SIGINT"),
    (
        Ending(first_signal=TERM, forced_by="grace"),
        "SIGTERM, forced when the grace ran out",
    ),
    (Ending(first_signal=INT, forced_by="signal"), "SIGINT, forced by another signal"),
    (Ending(forced_by="grace"), "the grace ran out"),
]


@pytest.mark.parametrize(("ending", "reason"), EXIT_REASON_TABLE)
def test_exit_reason_names_what_the_status_was_chosen_from(ending, reason):
    assert exit_reason(ending) == reason


# -- the collector's deferral ---------------------------------------------------------


@pytest.fixture
def collector() -> Iterator[tuple[int, int, int]]:
    before = gc.get_threshold()
    enabled = gc.isenabled()
    yield before
    gc.set_threshold(*before)
    if enabled:
        gc.enable()


@pytest.mark.parametrize("last", ["first", "second"])
def test_overlapping_holds_restore_when_the_last_one_ends(collector, last):
    a, b = GcHold(), GcHold()
    a.hold_full_collections()
    a.hold_pause()
    b.hold_full_collections()
    b.hold_pause()
    assert gc.get_threshold()[2] == NO_FULL_COLLECTIONS
    assert not gc.isenabled()
    first, second = (a, b) if last == "second" else (b, a)
    first.release()
    assert gc.get_threshold()[2] == NO_FULL_COLLECTIONS
    assert not gc.isenabled()
    second.release()
    assert gc.get_threshold() == collector
    assert gc.isenabled()


def test_holds_are_idempotent_and_release_twice_is_harmless(collector):
    hold = GcHold()
    hold.hold_full_collections()
    hold.hold_full_collections()
    hold.release()
    assert gc.get_threshold() == collector
    hold.release()
    assert gc.get_threshold() == collector


def test_a_collector_turned_off_stays_off(collector):
    gc.set_threshold(0, collector[1], collector[2])
    gc.disable()
    hold = GcHold()
    hold.hold_full_collections()
    hold.hold_pause()
    assert gc.get_threshold() == (0, collector[1], collector[2])
    hold.release()
    assert gc.get_threshold() == (0, collector[1], collector[2])
    assert not gc.isenabled()
