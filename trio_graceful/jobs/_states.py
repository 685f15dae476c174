"""The states of a durable job and the one table of legal transitions.

Everything that decides which job state may follow which lives here, in
`TRANSITIONS`: ``(state, event) -> next state``, held in `JOB_TABLE`. A pair
missing from the table is illegal: `JOB_TABLE.move` raises
`IllegalJobTransitionError` and the caller changes nothing. Every store
applies a transition only after this check, the state diagram in the
documentation is drawn from the same table (`diagram_lines`), and the tests
walk it.

The rules the table encodes:

* A job is claimed once per attempt: ``queued -> running``.
* A running job ends in exactly one terminal state: ``completed``,
  ``failed``, ``cancelled`` (through ``cancelling``) or ``timed_out``
  (through ``timing_out``). The intermediate states are written before the
  cleanup starts, the terminal ones after it ends, so that a crash in
  between is visible and a rescuer can finish the job's bookkeeping.
* A job that finished its work while a cancel request was served (it
  returned without looking at its STOP) is ``completed``, with its result:
  ``cancelling -> completed``. A job that stops as asked is ``cancelled``.
* A queued job may be cancelled before it ever runs.
* ``running -> queued`` hands a job back: at a worker's graceful shutdown,
  or when a rescuer finds that the worker holding it is gone.
* Nothing leaves a terminal state.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from .._core._statetable import StateTable
from ._exceptions import IllegalJobTransitionError


class JobState(enum.Enum):
    """The persisted state of a job.

    * ``QUEUED``: waiting for a worker (new, handed back or rescued).
    * ``RUNNING``: claimed by a worker, whose lease proves it is alive.
    * ``CANCELLING``: a cancel request is being served; cleanup runs.
    * ``TIMING_OUT``: the job's deadline passed; cleanup runs.
    * ``COMPLETED``, ``FAILED``, ``CANCELLED``, ``TIMED_OUT``: terminal.
    """

    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"
    TIMING_OUT = "timing_out"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"

    @property
    def terminal(self) -> bool:
        """True for a state that nothing leaves."""
        return self not in _LEFT


class JobEvent(enum.Enum):
    """What moves a job from one state to the next: the table's edge labels."""

    CLAIM = "claim"
    COMPLETE = "complete"
    FAIL = "fail"
    CANCEL = "cancel"
    FINISH_CANCEL = "finish cancel"
    TIME_OUT = "time out"
    FINISH_TIME_OUT = "finish time out"
    REQUEUE = "requeue"


_S = JobState
_E = JobEvent

TRANSITIONS: Final[Mapping[tuple[JobState, JobEvent], JobState]] = MappingProxyType(
    {
        (_S.QUEUED, _E.CLAIM): _S.RUNNING,
        (_S.QUEUED, _E.CANCEL): _S.CANCELLED,
        (_S.RUNNING, _E.COMPLETE): _S.COMPLETED,
        (_S.RUNNING, _E.FAIL): _S.FAILED,
        (_S.RUNNING, _E.CANCEL): _S.CANCELLING,
        (_S.RUNNING, _E.TIME_OUT): _S.TIMING_OUT,
        (_S.RUNNING, _E.REQUEUE): _S.QUEUED,
        (_S.CANCELLING, _E.FINISH_CANCEL): _S.CANCELLED,
        (_S.CANCELLING, _E.COMPLETE): _S.COMPLETED,
        (_S.TIMING_OUT, _E.FINISH_TIME_OUT): _S.TIMED_OUT,
    }
)
"""Every legal transition: ``(state, event) -> next state``."""

JOB_TABLE: Final = StateTable(TRANSITIONS, JobState, error=IllegalJobTransitionError)
"""The table's moves, as ``JOB_TABLE.move(state, event, subject="job 7")``."""

# The states some transition leaves, read off the table once.
_LEFT: Final = JOB_TABLE.left()


def diagram_lines() -> list[str]:
    """The transition table drawn as text, one transition per line.

    The documentation shows these lines (a test checks that they match), so
    the picture cannot drift from the table. Terminal states are marked
    with ``[end]``.
    """
    width = max(len(state.value) for state in JobState)
    label = max(len(event.value) for event in JobEvent) + 4
    lines: list[str] = []
    for (source, event), target in JOB_TABLE.transitions.items():
        arrow = f"--{event.value}--".ljust(label, "-") + ">"
        end = " [end]" if target.terminal else ""
        lines.append(f"{source.value:<{width}}  {arrow}  {target.value}{end}")
    return lines
