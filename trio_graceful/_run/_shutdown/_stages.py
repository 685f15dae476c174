"""The runner's stages: one table of what follows what, from running to ended.

Everything that decides the runner's stage lives here, in `STAGES`:
``(stage, move) -> next stage``. A pair that is not in the table is an
illegal move; it raises `IllegalMoveError` and changes nothing. What the
runner asks of a stage (has the shutdown begun? was it forced? which bundle
is draining?) is derived from the table, never kept in a flag beside it.

The rules the table encodes:

* A shutdown asked for while the program takes work may first withdraw it
  from rotation for the drain delay (it keeps serving), then drain.
* A run drains in two steps, in order: the root bundle (``main`` and its
  tasks), then the services.
* A shutdown may be *forced* (hard cancel) in either step, once; forcing is
  kept when the run moves on, up to the end (the exit status needs it).
* Nothing leaves an ended stage.

The public `Lifecycle` is the coarser view of the same run that programs
see, and `Stages` is its one writer for the runner: a move that the
lifecycle sees applies its event (`LIFECYCLE_EVENTS`) in the same call, so
the two never disagree, and the run's start, readiness and end go through
`Stages` too. Only a program's own `Lifecycle.degrade` and
`Lifecycle.recover` go to the lifecycle directly.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final, final

import trio

from ..._core._statetable import IllegalTransitionError, StateTable
from .._program._lifecycle import Lifecycle, LifecycleEvent, LifecycleState


class Stage(enum.Enum):
    """The stages of a run, in the order a run meets them."""

    RUNNING = "running"
    WITHDRAWN = "withdrawn; the drain delay runs"
    DRAINING_ROOT = "draining the root bundle"
    FORCED_ROOT = "forced; the root bundle unwinds"
    DRAINING_SERVICES = "draining the services"
    FORCED_SERVICES = "forced; the services unwind"
    ENDED = "ended"
    ENDED_FORCED = "ended after a forced shutdown"


class Move(enum.Enum):
    """What moves a run from one stage to the next."""

    WITHDRAW = "withdraw"
    SHUT_DOWN = "shut down"
    FORCE = "force"
    ROOT_CLOSED = "root bundle closed"
    SERVICES_CLOSED = "services closed"


_S = Stage

STAGES: Final[Mapping[tuple[Stage, Move], Stage]] = MappingProxyType(
    {
        (_S.RUNNING, Move.WITHDRAW): _S.WITHDRAWN,
        (_S.RUNNING, Move.SHUT_DOWN): _S.DRAINING_ROOT,
        (_S.WITHDRAWN, Move.SHUT_DOWN): _S.DRAINING_ROOT,
        (_S.DRAINING_ROOT, Move.FORCE): _S.FORCED_ROOT,
        (_S.DRAINING_ROOT, Move.ROOT_CLOSED): _S.DRAINING_SERVICES,
        (_S.FORCED_ROOT, Move.ROOT_CLOSED): _S.FORCED_SERVICES,
        (_S.DRAINING_SERVICES, Move.FORCE): _S.FORCED_SERVICES,
        (_S.DRAINING_SERVICES, Move.SERVICES_CLOSED): _S.ENDED,
        (_S.FORCED_SERVICES, Move.SERVICES_CLOSED): _S.ENDED_FORCED,
    }
)
"""Every legal move: ``(stage, move) -> next stage``."""


class IllegalMoveError(IllegalTransitionError):
    """A move the runner's stage table does not allow now; nothing changed."""


TABLE: Final = StateTable(STAGES, Stage, error=IllegalMoveError)
"""The questions asked of `STAGES`, and its one way to move."""

LIFECYCLE_EVENTS: Final[Mapping[Move, LifecycleEvent]] = MappingProxyType(
    {Move.WITHDRAW: LifecycleEvent.WITHDRAW, Move.SHUT_DOWN: LifecycleEvent.SHUT_DOWN}
)
"""The lifecycle event that each move the lifecycle sees applies."""


def _after(moves: frozenset[Move]) -> frozenset[Stage]:
    """The stages that one of ``moves``, then any moves, lead to."""
    first = {target for (_, move), target in STAGES.items() if move in moves}
    return frozenset(first) | TABLE.reachable(first)


SHUTTING_DOWN: Final = _after(frozenset({Move.SHUT_DOWN, Move.FORCE}))
"""The stages in which the shutdown has begun."""

FORCED: Final = _after(frozenset({Move.FORCE}))
"""The stages in which the shutdown has been forced."""

ROOT_CLOSED: Final = _after(frozenset({Move.ROOT_CLOSED}))
"""The stages in which the root bundle has closed and the services drain."""


@final
class Stages:
    """The stage of one run, and the one writer of its lifecycle.

    Args:
        lifecycle: The run's lifecycle, which only this object moves.
        on_transition: Called with the event and the state it left after
            each transition of the lifecycle.
    """

    def __init__(
        self,
        lifecycle: Lifecycle,
        on_transition: Callable[[LifecycleEvent, LifecycleState], object],
    ) -> None:
        self._stage = Stage.RUNNING
        self._shutting_down = trio.Event()
        self._lifecycle = lifecycle
        self._on_transition = on_transition

    @property
    def stage(self) -> Stage:
        """The current `Stage`."""
        return self._stage

    @property
    def lifecycle(self) -> Lifecycle:
        """The run's `Lifecycle`, which this object moves."""
        return self._lifecycle

    @property
    def shutting_down(self) -> bool:
        """Whether the shutdown has begun."""
        return self._stage in SHUTTING_DOWN

    @property
    def withdrawn(self) -> bool:
        """Whether the drain delay runs (the shutdown proper has not begun)."""
        return self._stage is Stage.WITHDRAWN

    @property
    def forced(self) -> bool:
        """Whether the shutdown has been forced."""
        return self._stage in FORCED

    @property
    def root_closed(self) -> bool:
        """Whether the root bundle has closed (the services drain, or have)."""
        return self._stage in ROOT_CLOSED

    def move(self, move: Move, reason: str = "") -> Stage:
        """Apply ``move``, and its lifecycle event if it has one; return the new stage.

        Not a checkpoint.

        Args:
            move (Move): The move.
            reason (str): Why, for the lifecycle.

        Raises:
            IllegalMoveError: if ``(stage, move)`` is not in `STAGES`.
        """
        target = TABLE.move(self._stage, move, subject="the runner")
        self._stage = target
        if target in SHUTTING_DOWN:
            self._shutting_down.set()
        event = LIFECYCLE_EVENTS.get(move)
        if event is not None:
            self._transition(event, reason)
        return target

    def start(self) -> None:
        """Tell the lifecycle that the program starts. Not a checkpoint."""
        self._transition(LifecycleEvent.START, "")

    def become_ready(self) -> None:
        """Tell the lifecycle that ``main`` is ready, if it is still starting.

        Not a checkpoint.
        """
        if self._lifecycle.state is LifecycleState.STARTING:
            self._transition(LifecycleEvent.BECOME_READY, "main is ready")

    def terminate(self, reason: str) -> None:
        """Tell the lifecycle that the run has ended. Not a checkpoint."""
        self._transition(LifecycleEvent.TERMINATE, reason)

    async def wait_shutting_down(self) -> None:
        """Wait until the shutdown has begun. This is a checkpoint."""
        await self._shutting_down.wait()

    def _transition(self, event: LifecycleEvent, reason: str) -> None:
        source = self._lifecycle.state
        self._lifecycle._transition(event, reason)  # pyright: ignore[reportPrivateUsage]
        self._on_transition(event, source)
