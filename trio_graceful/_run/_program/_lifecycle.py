"""The lifecycle of a program run by `trio_graceful.run`: states and transitions.

Everything that decides which state follows which lives in this module, in
one table, `TRANSITIONS`: ``(state, event) -> next state``. A pair that is not
in the table is an illegal transition; it raises `IllegalTransitionError` and
changes nothing. The documentation's state diagram and the tests of every
legal and every illegal transition are generated from the same table.

The rules the table encodes:

* A program starts once: ``uninitialized`` is left for good.
* It may be degraded and recover any number of times while it runs.
* Leaving is monotonic: a program ``withdrawn`` from rotation (the drain
  delay, when it no longer takes new work but still serves) only goes on to
  ``shutting down``; from there the only way is on to ``terminated``, and
  nothing leaves ``terminated``.
* A shutdown may begin during startup (a signal, a failed or timed-out
  startup); the program then goes through ``shutting down`` too, because what
  had started is stopped in order.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, cast, final

import attrs
import trio

from ..._core._log import library_logger
from ..._core._lowlevel import NoPublicConstructor
from ..._core._statetable import StateTable
from ..._core._trace import TraceKind, emit, tracing

logger = library_logger("trio_graceful.lifecycle")


class LifecycleState(enum.Enum):
    """The states of a `Lifecycle`, in the order a program normally meets them.

    * ``UNINITIALIZED``: nothing has started yet.
    * ``STARTING``: ``main`` runs and has not yet said it is ready.
    * ``READY``: ``main`` called ``task_status.started()``, or takes no
      ``task_status``.
    * ``DEGRADED``: running, with a part known not to work
      (`Lifecycle.degrade`).
    * ``WITHDRAWN``: the shutdown was asked for and the drain delay runs: not
      ready (the load balancer takes the program out of rotation), but still
      serving normally until the shutdown proper begins.
    * ``SHUTTING_DOWN``: a shutdown has begun; the grace period runs.
    * ``TERMINATED``: every task and service has ended.
    """

    UNINITIALIZED = "uninitialized"
    STARTING = "starting"
    READY = "ready"
    DEGRADED = "degraded"
    WITHDRAWN = "withdrawn"
    SHUTTING_DOWN = "shutting down"
    TERMINATED = "terminated"


class LifecycleEvent(enum.Enum):
    """What makes a lifecycle change state: the labels of the table's edges."""

    START = "start"
    BECOME_READY = "become ready"
    DEGRADE = "degrade"
    RECOVER = "recover"
    WITHDRAW = "withdraw"
    SHUT_DOWN = "shut down"
    TERMINATE = "terminate"


_S, _E = LifecycleState, LifecycleEvent

TRANSITIONS: Final[Mapping[tuple[LifecycleState, LifecycleEvent], LifecycleState]] = (
    MappingProxyType(
        {
            (_S.UNINITIALIZED, _E.START): _S.STARTING,
            (_S.STARTING, _E.BECOME_READY): _S.READY,
            (_S.STARTING, _E.SHUT_DOWN): _S.SHUTTING_DOWN,
            (_S.READY, _E.DEGRADE): _S.DEGRADED,
            (_S.READY, _E.WITHDRAW): _S.WITHDRAWN,
            (_S.READY, _E.SHUT_DOWN): _S.SHUTTING_DOWN,
            # A second failing part degrades again, with its own reason.
            (_S.DEGRADED, _E.DEGRADE): _S.DEGRADED,
            (_S.DEGRADED, _E.RECOVER): _S.READY,
            (_S.DEGRADED, _E.WITHDRAW): _S.WITHDRAWN,
            (_S.DEGRADED, _E.SHUT_DOWN): _S.SHUTTING_DOWN,
            (_S.WITHDRAWN, _E.SHUT_DOWN): _S.SHUTTING_DOWN,
            (_S.SHUTTING_DOWN, _E.TERMINATE): _S.TERMINATED,
        }
    )
)
"""Every legal transition: ``(state, event) -> next state``."""

TABLE: Final = StateTable(TRANSITIONS, LifecycleState)
"""The table's questions (where an event is legal, what is reachable)."""

INITIAL_STATE: Final = LifecycleState.UNINITIALIZED

READY_STATES: Final = frozenset({LifecycleState.READY, LifecycleState.DEGRADED})
"""The states in which the program takes new work (what a readiness probe asks)."""


REACHABLE: Final[Mapping[LifecycleState, frozenset[LifecycleState]]] = MappingProxyType(
    {state: TABLE.reachable([state]) for state in LifecycleState}
)
"""For each state, the states still reachable from it (itself only via a cycle)."""


class StateUnreachableError(RuntimeError):
    """`Lifecycle.wait_state` waited for a state the lifecycle can no longer reach.

    For example, waiting for ``READY`` once the program is shutting down.
    """


@final
@attrs.define(eq=False, repr=False, slots=False)
class Lifecycle(metaclass=NoPublicConstructor):
    """The observable state of a program run by `trio_graceful.run`.

    Get it from `Runner.lifecycle`. The runner drives start, ready, shutdown
    and termination; your code may mark the program degraded and recovered
    (`degrade`, `recover`). Read `state` at any time, or wait for a state with
    `wait_state`. Every transition is logged on the
    ``trio_graceful.lifecycle`` logger: at WARNING when it enters
    ``degraded``, at INFO when it recovers, and at DEBUG otherwise (the runner
    logs its own stages in words on ``trio_graceful.runner``).

    The methods must be called from the Trio thread that runs the program
    (from another thread, use `trio.from_thread.run_sync`).
    """

    _name: str
    _state: LifecycleState = INITIAL_STATE
    _reason: str = ""
    _changed_at: float | None = None
    # Set, and replaced by a fresh event, at every transition.
    _changed: trio.Event = attrs.field(factory=trio.Event)
    # For each state, the event set when it is next entered: set while the
    # state lasts, replaced by a fresh one when it is left.
    _entered: dict[LifecycleState, trio.Event] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._entered = {state: trio.Event() for state in LifecycleState}
        self._entered[self._state].set()

    def __repr__(self) -> str:
        return f"<trio_graceful.Lifecycle {self._name!r} {self._state.value}>"

    @property
    def name(self) -> str:
        """The name of the program, as given to `trio_graceful.run`."""
        return self._name

    @property
    def state(self) -> LifecycleState:
        """The current `LifecycleState`."""
        return self._state

    @property
    def ready(self) -> bool:
        """Whether the program takes new work (True while ready or degraded).

        This is what a readiness probe asks; it turns False at the first
        shutdown signal (``withdrawn``, then ``shutting down``), while the
        program still serves what it has.
        """
        return self._state in READY_STATES

    @property
    def reason(self) -> str:
        """Why the current state was entered, such as ``"SIGTERM"``; may be empty."""
        return self._reason

    @property
    def changed_at(self) -> float | None:
        """When the current state was entered, in Trio time; `None` before the start."""
        return self._changed_at

    def degrade(self, reason: str) -> None:
        """Mark the program as running with a part that does not work.

        Legal when ready or already degraded (a second failing part updates
        the reason). Not a checkpoint.

        Args:
            reason (str): What does not work, for the log and `reason`.

        Raises:
            IllegalTransitionError: if the program is not ready or degraded
                (it is starting, shutting down or terminated).
        """
        self._transition(LifecycleEvent.DEGRADE, reason)

    def recover(self, reason: str = "recovered") -> None:
        """Mark a degraded program as ready again. Not a checkpoint.

        Args:
            reason (str): Why, for the log and `reason`.

        Raises:
            IllegalTransitionError: if the program is not degraded.
        """
        self._transition(LifecycleEvent.RECOVER, reason)

    async def wait_state(self, state: LifecycleState) -> None:
        """Wait until the lifecycle is in ``state``.

        Returns at once if it already is, otherwise once it has entered
        ``state``, even if it has moved on by the time the waiting task runs
        (a program can become ready and start shutting down in the same
        instant). This is a checkpoint.

        Raises:
            StateUnreachableError: if the lifecycle is in, or moves to, a state
                from which ``state`` can no longer be reached (waiting for
                ``READY`` when the program is shutting down, say).
            TypeError: if ``state`` is not a `LifecycleState`.
        """
        if not isinstance(cast("object", state), LifecycleState):
            raise TypeError(f"state must be a LifecycleState, not {state!r}")
        await trio.lowlevel.checkpoint_if_cancelled()
        entered = self._entered[state]
        while not entered.is_set():
            if state not in REACHABLE[self._state]:
                raise StateUnreachableError(
                    f"lifecycle {self._name!r} is {self._state.value} and can no "
                    f"longer become {state.value}"
                )
            await self._changed.wait()
        await trio.lowlevel.cancel_shielded_checkpoint()

    def _transition(self, event: LifecycleEvent, reason: str) -> LifecycleState:
        """Apply ``event``; the runner's entry point for its own events.

        Raises:
            IllegalTransitionError: if ``(state, event)`` is not in the table;
                nothing changes then.
            TypeError: if ``reason`` is not a string.
            RuntimeError: if called from outside the Trio run.
        """
        if not isinstance(cast("object", reason), str):
            raise TypeError(f"reason must be a string, not {reason!r}")
        source = self._state
        target = TABLE.move(source, event, subject=f"lifecycle {self._name!r}")
        now = trio.current_time()
        self._state, self._reason, self._changed_at = target, reason, now
        if target is not source:
            self._entered[source] = trio.Event()
        self._entered[target].set()
        changed, self._changed = self._changed, trio.Event()
        changed.set()
        # The runner logs its own stages (shutting down, forcing, ...) in
        # words; degrading and recovering are news only the lifecycle has.
        if target is LifecycleState.DEGRADED:
            level = logging.WARNING
        elif event is LifecycleEvent.RECOVER:
            level = logging.INFO
        else:
            level = logging.DEBUG
        change = f"{self._name}: {source.value} -> {target.value}" + (
            f" ({reason})" if reason else ""
        )
        logger.log(level, "%s", change)
        if tracing.active:
            emit(TraceKind.STATE_CHANGED, "", detail=change)
        return target
