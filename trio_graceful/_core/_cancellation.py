"""One cancellation of a bundle: its record, and the code that carries it out.

Two pieces, each with one owner:

* `CancelRecord`, what was asked and what happened: when the cancellation
  started, the hard deadline (only ever moved earlier), the hard cancel
  (when, and its `HardCancelCause`, written once) and each child's end. It is
  plain state; only the `CancelDriver` writes it.
* `CancelDriver`, created by the first `Bundle.cancel` call and shared by
  every later one. It applies the deadline to the children, starts the hard
  cancels that a cancellation starts itself (a grace of 0, a waiting caller
  cancelled), takes each child's end from the bundle's child watch, writes
  the `CancelReport` when the last child has ended, and makes the callers
  wait for it.

A cause is recorded where the hard cancel starts, never inferred later from
the clock:

* a grace of 0 and a cancelled caller: where the driver cancels the
  children's scope (with a ``reason=`` for Trio's `trio.Cancelled`);
* a child that raised: at that child's end, which is what cancels its
  siblings;
* the grace that expired: Trio cancels the children's scope at its
  deadline, which only this cancellation sets, so an unexplained cancel of
  that scope is its deadline; it is recorded by the first child to end
  after it (or by the traced driver, woken at the deadline);
* anything else (the bundle's `Bundle.cancel_scope`, a scope around the
  bundle) leaves the children's own scope untouched: the first child to end
  records it, with Trio's own account of that cancel.

Callers hard-cancelled while they waited keep their report: it is left (in
the run's ``_left_by``) for the caller's entry (`ChildEnd.reports`) in the
report of its own bundle, if that one is cancelling, instead of being lost
with the caller's `trio.Cancelled`.

The first caller drives the progress: it waits in a scope that wakes it at
the deadline (to trace the hard cancel as it happens) and every
``PROGRESS_INTERVAL`` seconds (to log what is still running).
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Callable
from typing import final

import attrs
import trio

from ._groups import first_leaf
from ._log import logger, plural
from ._paths import task_path
from ._report import CancelReport, ChildEnd, ChildOutcome, HardCancelCause
from ._topology import BundleNurseries
from ._trace import TraceKind, emit, tracing

# How often a long cancellation logs that it is still waiting, in seconds.
PROGRESS_INTERVAL = 2.0

# Bundles at most this many levels below the top of their run log their
# cancellations at INFO, deeper ones at DEBUG; see `log_as_news`.
_news_depth: trio.lowlevel.RunVar[int] = trio.lowlevel.RunVar(
    "trio_graceful news depth", default=0
)


# The reports of cancellations whose waiting caller was hard-cancelled, by
# caller, until the caller's own end is recorded (weakly held: a caller whose
# end nobody records leaves nothing behind).
_left_by: trio.lowlevel.RunVar[
    weakref.WeakKeyDictionary[trio.lowlevel.Task, list[CancelReport]]
] = trio.lowlevel.RunVar("trio_graceful reports left by cancelled callers")


def _leave_report(caller: trio.lowlevel.Task, report: CancelReport) -> None:
    try:
        left = _left_by.get()
    except LookupError:
        left = weakref.WeakKeyDictionary["trio.lowlevel.Task", "list[CancelReport]"]()
        _left_by.set(left)
    left.setdefault(caller, []).append(report)


def _reports_left_by(task: trio.lowlevel.Task) -> tuple[CancelReport, ...]:
    try:
        return tuple(_left_by.get().pop(task, ()))
    except LookupError:
        return ()


def log_as_news(depth: int) -> None:
    """Log the cancellations of bundles up to ``depth`` levels deep at INFO.

    For the current Trio run: 0 (the default) means top-level bundles only.
    The runner, whose own bundles are the top level, sets 1 so that what a
    program's ``main`` opens is reported too, and -1 (none) for the rollback
    of a failed startup.
    """
    _news_depth.set(depth)


@attrs.define(eq=False)
class CancelRecord:
    """What one cancellation of a bundle was asked, and what happened so far."""

    started_at: float
    """When the first `Bundle.cancel` call started, in Trio time."""

    deadline: float = math.inf
    """The hard deadline: the earliest ``now + grace`` asked for."""

    hard_cancelled_at: float | None = None
    """When the children were hard-cancelled, if they were."""

    hard_cancel_cause: HardCancelCause | None = None
    """Why they were, recorded with `hard_cancelled_at`."""

    ended: list[ChildEnd] = attrs.field(factory=list[ChildEnd])
    """The children's ends, in order."""

    def move_deadline(self, deadline: float) -> bool:
        """Make ``deadline`` the hard deadline if it is earlier; tell if it was."""
        if deadline < self.deadline:
            self.deadline = deadline
            return True
        return False

    def note_hard_cancel(self, cause: HardCancelCause, at: float) -> bool:
        """Record the hard cancel, unless one is recorded; tell if this one was."""
        if self.hard_cancel_cause is not None:
            return False
        self.hard_cancel_cause = cause
        self.hard_cancelled_at = at
        return True

    def report(self, bundle: str, finished_at: float) -> CancelReport:
        """The report of the cancellation, finished at ``finished_at``."""
        return CancelReport(
            bundle=bundle,
            started_at=self.started_at,
            finished_at=finished_at,
            hard_deadline=self.deadline,
            hard_cancelled_at=self.hard_cancelled_at,
            hard_cancel_cause=self.hard_cancel_cause,
            children=tuple(self.ended),
        )


@final
class CancelDriver:
    """Carries out one cancellation of a bundle; see the module docstring.

    Args:
        nurseries: The bundle's nurseries, whose children it cancels.
        name: The bundle's name, for the report.
        path: The bundle's path, for logs and traces.
        on_finished: Called once, when the report is written.
    """

    __slots__ = (
        "_all_done",
        "_cancelled_callers",
        "_name",
        "_nurseries",
        "_on_finished",
        "_path",
        "_wake",
        "record",
        "report",
    )

    def __init__(
        self,
        nurseries: BundleNurseries,
        name: str,
        path: str,
        *,
        on_finished: Callable[[], object],
    ) -> None:
        self._nurseries = nurseries
        self._name = name
        self._path = path
        self._on_finished = on_finished
        #: What was asked and what happened; written here only.
        self.record = CancelRecord(trio.current_time())
        #: The report, once every child has ended.
        self.report: CancelReport | None = None
        self._all_done = trio.Event()
        # The scope the first caller waits in, while it drives.
        self._wake: trio.CancelScope | None = None
        # Callers hard-cancelled while they waited, before the report was written.
        self._cancelled_callers: list[trio.lowlevel.Task] = []

    # -- what the callers ask ---------------------------------------------------------

    def ask(self, grace: float) -> None:
        """Apply a `Bundle.cancel` call's ``grace``: the deadline moves earlier only.

        A grace of 0 is a hard cancel, which starts here.
        """
        now = trio.current_time()
        record = self.record
        moved = record.move_deadline(now + grace)
        if tracing.active:
            emit(
                TraceKind.CANCEL_STARTED,
                self._path,
                task_path(trio.lowlevel.current_task()),
                grace=grace,
                deadline=record.deadline,
            )
        if not moved:
            return
        if grace == 0:
            self.hard_cancel(HardCancelCause.NO_GRACE)
        self._nurseries.set_children_deadline(record.deadline)
        if self._wake is not None:
            self._wake.deadline = min(self._wake.deadline, record.deadline)

    def hard_cancel(self, cause: HardCancelCause) -> None:
        """Hard-cancel the children now, for ``cause``, unless the deadline did."""
        self._note_expired_grace()
        reason = self._note_hard_cancel(cause, trio.current_time())
        self._nurseries.cancel_children(reason)

    def _note_expired_grace(self) -> None:
        # Trio cancels the children's scope at the deadline, and nothing
        # else cancels it without a record here (see the module docstring).
        if (
            self.record.hard_cancel_cause is None
            and self._nurseries.children_cancel_called
        ):
            self._note_hard_cancel(HardCancelCause.GRACE_EXPIRED, self.record.deadline)

    def _note_hard_cancel(
        self, cause: HardCancelCause, at: float, detail: str | None = None
    ) -> str:
        # Record (and trace) the first hard cancel; return what to tell Trio.
        reason = detail or self._explain(cause)
        if self.record.note_hard_cancel(cause, at) and tracing.active:
            emit(
                TraceKind.HARD_CANCEL,
                self._path,
                deadline=self.record.deadline,
                detail=reason,
            )
        return reason

    def _explain(self, cause: HardCancelCause) -> str:
        if cause is HardCancelCause.NO_GRACE:
            return f"cancel() of bundle {self._name!r} was given no grace"
        if cause is HardCancelCause.CALLER_CANCELLED:
            return (
                f"the task waiting in cancel() of bundle {self._name!r} was cancelled"
            )
        return "the grace period ran out"

    # -- the children's ends --------------------------------------------------------

    def child_ended(
        self,
        task: trio.lowlevel.Task,
        exc: BaseException | None,
        outcome: ChildOutcome,
        abandoned: tuple[str, ...],
        notes: tuple[str, ...],
    ) -> None:
        """Record how the child ``task`` ended; finish if it was the last."""
        record = self.record
        reports: tuple[CancelReport, ...] = ()
        if outcome is not ChildOutcome.FINISHED:
            if record.hard_cancel_cause is None:
                self._note_unasked_hard_cancel(outcome, exc)
            # only a hard-cancelled child can have left a waiting caller's report
            reports = _reports_left_by(task)
        now = trio.current_time()
        record.ended.append(
            ChildEnd(
                name=task.name,
                outcome=outcome,
                ended_at=now,
                elapsed=now - record.started_at,
                error=repr(exc) if outcome is ChildOutcome.RAISED else None,
                abandoned=abandoned,
                notes=notes,
                reports=reports,
            )
        )
        self.finish_if_done()

    def _note_unasked_hard_cancel(
        self, outcome: ChildOutcome, exc: BaseException | None
    ) -> None:
        # A hard cancel that the driver did not start; see the module docstring.
        # What Trio says of the cancel the child saw (None if it returned or
        # raised something else).
        cancelled = None if exc is None else first_leaf(exc)
        if not isinstance(cancelled, trio.Cancelled):
            cancelled = None
        # A nursery's cancel (a sibling raised before the cancellation began)
        # also cancels the children's scope: that one was not the deadline.
        if cancelled is None or cancelled.source == "deadline":
            self._note_expired_grace()
        now = trio.current_time()
        if outcome is ChildOutcome.RAISED:
            self._note_hard_cancel(
                HardCancelCause.CHILD_RAISED, now, f"a child raised {exc!r}"
            )
            return
        self._note_hard_cancel(
            HardCancelCause.CANCELLED_FROM_OUTSIDE,
            now,
            "cancelled from outside the bundle (its cancel_scope, or an "
            "enclosing scope)" + ("" if cancelled is None else f": {cancelled}"),
        )

    def finish_if_done(self) -> None:
        """Write the report if no child is left and it is not written yet."""
        if self.report is not None or self._nurseries.live:
            return
        report = self.report = self.record.report(self._name, trio.current_time())
        summary = report.summary(name=self._path)
        logger.log(self._log_level(abandoned=bool(report.abandoned)), "%s", summary)
        if tracing.active:
            emit(TraceKind.CANCEL_FINISHED, self._path, detail=summary)
        for caller in self._cancelled_callers:
            _leave_report(caller, report)
        self._cancelled_callers.clear()
        self._all_done.set()
        self._on_finished()

    # -- waiting -------------------------------------------------------------------

    async def wait(self) -> CancelReport:
        """Wait until every child has ended; return the report.

        The first caller drives (see the module docstring); later ones just
        wait. If the caller is cancelled, the children are hard-cancelled at
        once, and the report, once written, is left for the caller's entry in
        its own bundle's report. This is a checkpoint.
        """
        try:
            if self._wake is None and self.report is None:
                await self._drive()
            else:
                await self._all_done.wait()
        except BaseException:
            caller = trio.lowlevel.current_task()
            if self.report is None:
                self._cancelled_callers.append(caller)
            else:
                _leave_report(caller, self.report)
            self.hard_cancel(HardCancelCause.CALLER_CANCELLED)
            raise
        assert self.report is not None
        return self.report

    async def _drive(self) -> None:
        # Without trace hooks and with progress logging off this is a single
        # wait: the caller is woken by the last child, never by a timer.
        level = self._log_level()
        record = self.record
        now = trio.current_time()
        progress_due = (
            now + PROGRESS_INTERVAL if logger.isEnabledFor(level) else math.inf
        )
        try:
            while True:
                due = progress_due
                if tracing.active and record.hard_cancel_cause is None:
                    due = min(due, record.deadline)
                self._wake = trio.CancelScope(deadline=due)
                with self._wake:
                    await self._all_done.wait()
                if self._all_done.is_set():
                    return
                self._note_expired_grace()
                now = trio.current_time()
                if now >= progress_due:
                    progress_due = now + PROGRESS_INTERVAL
                    self._log_progress(level, now)
        finally:
            self._wake = None

    def _log_progress(self, level: int, now: float) -> None:
        live = self._nurseries.live
        left = self.record.deadline - now
        logger.log(
            level,
            "bundle %r: waiting for %s, %s of grace left",
            self._path,
            plural(live, "child", "children"),
            f"{left:.1f} s" if left > 0 else "none",
        )

    def _log_level(self, *, abandoned: bool = False) -> int:
        # A shutdown of the whole program is news, and so is anything left
        # running; the many small bundles inside (one per connection, say)
        # are details.
        if abandoned or self._path.count("/") <= _news_depth.get():
            return logging.INFO
        return logging.DEBUG
