"""One job attempt inside its worker: what its supervisor does next, as a table.

The persisted job states (`_states`) say where a job is for everyone; this
table says where one attempt is for the worker running it. Five things
can happen to an attempt, in any order: its function ends (``END``), a
cancel request arrives (``CANCEL``), the worker begins to drain
(``DRAIN``), its deadline passes (``TIME_OUT``, seen only while it runs),
the store says that the job is no longer the worker's (``LOSE``). The
first that the supervisor can act on decides the path:

* ``ENDED``: settle by the function's outcome (completed, failed, or, if it
  stopped on request, handed back);
* ``CANCELLING``: serve the cancel request (STOP, ``cancel_grace``, cancelled);
* ``DRAINING``: STOP with what is left of the worker's grace, then settle by
  the outcome, handing back a job that did not finish;
* ``DRAINING_CANCELLED``: as draining, but a job that did not finish is
  cancelled rather than handed back: the request wins over a hand-back;
* ``TIMING_OUT``: hard-cancel the job, then settle it as timed out;
* ``LOST``: another worker settled the job after this one's lease expired
  (it may run there on a later attempt): hard-cancel the job, write
  nothing. ``LOSE`` wins from every state, since whatever the attempt was
  doing, its writes are refused now.

Later events that change nothing are self-loops; a pair missing from the
table is a bug (`IllegalAttemptTransitionError`) and changes nothing.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import attrs
import outcome
import trio

from .._core._statetable import StateTable
from ._exceptions import IllegalAttemptTransitionError
from ._records import JobRecord


class AttemptState(enum.Enum):
    """Where an attempt is in its worker (see the module docstring)."""

    RUNNING = "running"
    ENDED = "ended"
    CANCELLING = "cancelling"
    DRAINING = "draining"
    DRAINING_CANCELLED = "draining, cancel requested"
    TIMING_OUT = "timing out"
    LOST = "lost"


class AttemptEvent(enum.Enum):
    """What happens to an attempt."""

    END = "end"
    CANCEL = "cancel"
    DRAIN = "drain"
    TIME_OUT = "time out"
    LOSE = "lose"


_S = AttemptState
_E = AttemptEvent

ATTEMPT_TRANSITIONS: Final[Mapping[tuple[AttemptState, AttemptEvent], AttemptState]] = (
    MappingProxyType(
        {
            (_S.RUNNING, _E.END): _S.ENDED,
            (_S.RUNNING, _E.CANCEL): _S.CANCELLING,
            (_S.RUNNING, _E.DRAIN): _S.DRAINING,
            (_S.RUNNING, _E.TIME_OUT): _S.TIMING_OUT,
            (_S.ENDED, _E.CANCEL): _S.ENDED,
            (_S.ENDED, _E.DRAIN): _S.ENDED,
            (_S.CANCELLING, _E.END): _S.CANCELLING,
            (_S.CANCELLING, _E.CANCEL): _S.CANCELLING,
            (_S.CANCELLING, _E.DRAIN): _S.CANCELLING,
            (_S.DRAINING, _E.END): _S.DRAINING,
            (_S.DRAINING, _E.CANCEL): _S.DRAINING_CANCELLED,
            (_S.DRAINING_CANCELLED, _E.END): _S.DRAINING_CANCELLED,
            (_S.DRAINING_CANCELLED, _E.CANCEL): _S.DRAINING_CANCELLED,
            (_S.TIMING_OUT, _E.END): _S.TIMING_OUT,
            (_S.TIMING_OUT, _E.CANCEL): _S.TIMING_OUT,
            (_S.TIMING_OUT, _E.DRAIN): _S.TIMING_OUT,
            **{(state, _E.LOSE): _S.LOST for state in AttemptState},
            (_S.LOST, _E.END): _S.LOST,
            (_S.LOST, _E.CANCEL): _S.LOST,
            (_S.LOST, _E.DRAIN): _S.LOST,
        }
    )
)
"""Every legal move of an attempt: ``(state, event) -> next state``."""

ATTEMPT_TABLE: Final = StateTable(
    ATTEMPT_TRANSITIONS, AttemptState, error=IllegalAttemptTransitionError
)


@attrs.define(eq=False)
class Attempt:
    """A job attempt in its worker: its state, its outcome, its unsaved progress.

    The state changes only through `apply`, which wakes the supervisor.
    """

    job: JobRecord
    state: AttemptState = AttemptState.RUNNING
    outcome: outcome.Outcome[Any] | None = None
    """What the job function returned or raised, once it has ended."""
    unsaved: Mapping[str, Any] | None = None
    """Progress reported while the store was away, to be written when back."""
    successor: Attempt | None = None
    """The job its settlement claimed, to run next in the same task."""
    scope: trio.CancelScope | None = None
    """The cancel scope of the job's bundle, while it runs: a hard cancel."""
    _changed: trio.Event = attrs.field(factory=trio.Event, init=False)

    def apply(self, event: AttemptEvent) -> AttemptState:
        """Move by ``event``; wake the supervisor if the state changed.

        Not a checkpoint.

        Raises:
            IllegalAttemptTransitionError: if the table has no such move.
        """
        target = ATTEMPT_TABLE.move(
            self.state, event, subject=f"job {self.job.id}: an attempt"
        )
        if target is not self.state:
            self.state = target
            self._changed.set()
            self._changed = trio.Event()
        return target

    async def wait_decided(self, deadline: float) -> AttemptState:
        """Wait while the attempt is running, until ``deadline`` at most.

        If the deadline passes first, moves by ``TIME_OUT``. Returns the
        state that ended the wait. This is a checkpoint.
        """
        if deadline == math.inf:
            # Most jobs have no timeout: a cancel scope would cost more
            # than the wait itself.
            await self._wait_decided()
            return self.state
        with trio.move_on_at(deadline):
            await self._wait_decided()
        if self.state is AttemptState.RUNNING:
            self.apply(AttemptEvent.TIME_OUT)
        return self.state

    async def _wait_decided(self) -> None:
        await trio.lowlevel.checkpoint()
        while self.state is AttemptState.RUNNING:
            await self._changed.wait()

    def keep_unsaved(self, progress: Mapping[str, Any]) -> None:
        """Keep ``progress`` to write later, unless newer progress waits.

        Not a checkpoint.
        """
        if self.unsaved is None:
            self.unsaved = progress

    @property
    def cancel_requested(self) -> bool:
        """True if a cancel request decided (or will decide) the attempt's end."""
        return self.state in (AttemptState.CANCELLING, AttemptState.DRAINING_CANCELLED)
