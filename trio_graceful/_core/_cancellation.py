"""One cancellation of a bundle: its deadline, its hard cancel, the children's ends.

A `Cancellation` is created by the first `Bundle.cancel` call and shared by
every later one. It is the single owner and the single writer of:

* the hard deadline, which only ever moves earlier;
* the hard cancel: when it happened and why, recorded (and traced) once,
  whoever noticed it (a waiting caller cancelled, the deadline, a failing
  child, or an enclosing scope that cancelled the children from outside);
* the record of each child's end, and the finished `CancelReport`;
* the callers that were hard-cancelled while they waited: the report is kept
  for each (in the run's ``_left_by``) and becomes part of its entry
  (`ChildEnd.reports`) in the report of its own bundle, if that one is
  cancelling, instead of being lost with the caller's `trio.Cancelled`;
* the progress driver: the first caller waits in a scope that wakes it at the
  deadline (to trace the hard cancel as it happens) and every
  ``PROGRESS_INTERVAL`` seconds (to log what is still running).
"""

from __future__ import annotations

import logging
import math
import weakref

import attrs
import trio

from ._groups import is_cancellation
from ._log import logger, plural
from ._report import CancelReport, ChildEnd, ChildOutcome
from ._topology import TwoLevelNursery
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


def outcome_of(exc: BaseException | None, levels: TwoLevelNursery) -> ChildOutcome:
    """How the calling child task of ``levels`` ended, returning or raising ``exc``.

    A child that returned while a hard cancel of it was in effect swallowed
    the `trio.Cancelled` it was given: it counts as hard-cancelled.
    """
    if exc is not None:
        return ChildOutcome.CANCELLED if is_cancellation(exc) else ChildOutcome.RAISED
    # Walking the cancel scopes is the costly part: only when one was cancelled.
    if (
        levels.children_cancel_called or levels.outer.cancel_scope.cancel_called
    ) and trio.current_effective_deadline() == -math.inf:
        return ChildOutcome.CANCELLED
    return ChildOutcome.FINISHED


@attrs.define(eq=False)
class Cancellation:
    """The record of a bundle's cancellation; see the module docstring."""

    _levels: TwoLevelNursery
    _name: str
    _path: str
    started_at: float
    deadline: float = math.inf
    hard_cancelled_at: float | None = None
    ended: list[ChildEnd] = attrs.field(factory=list[ChildEnd])
    report: CancelReport | None = None
    _all_done: trio.Event = attrs.field(factory=trio.Event)
    _driver: trio.CancelScope | None = None
    # Callers hard-cancelled while they waited, before the report was written.
    _cancelled_callers: list[trio.lowlevel.Task] = attrs.field(
        factory=list["trio.lowlevel.Task"]
    )

    # -- the deadline and the hard cancel -------------------------------------------

    def move_deadline(self, deadline: float) -> None:
        """Make ``deadline`` the hard deadline if it is earlier than the current one."""
        if deadline < self.deadline:
            self.deadline = deadline
            self._levels.set_children_deadline(deadline)
            if self._driver is not None:
                self._driver.deadline = min(self._driver.deadline, deadline)

    def hard_cancel(self, reason: str) -> None:
        """Hard-cancel the children now."""
        self._note_hard_cancel(trio.current_time(), reason)
        self._levels.cancel_children(reason)

    def _note_hard_cancel(self, at: float, reason: str) -> None:
        if self.hard_cancelled_at is not None:
            return
        self.hard_cancelled_at = at
        if tracing.active:
            emit(
                TraceKind.HARD_CANCEL,
                self._path,
                deadline=self.deadline,
                detail=reason,
            )

    def _notice_hard_cancel(
        self, outcome: ChildOutcome, exc: BaseException | None
    ) -> None:
        # A child's end tells that a hard cancel happened, if nobody said so.
        if outcome is ChildOutcome.RAISED:
            self._note_hard_cancel(trio.current_time(), f"a child raised {exc!r}")
        elif (
            self._levels.children_cancel_called and trio.current_time() >= self.deadline
        ):
            self._note_hard_cancel(self.deadline, "the grace period ran out")
        else:
            self._note_hard_cancel(
                trio.current_time(),
                "cancelled from outside the bundle (its cancel_scope, or an "
                "enclosing scope)",
            )

    # -- the children's ends --------------------------------------------------------

    def child_ended(
        self,
        task: trio.lowlevel.Task,
        exc: BaseException | None,
        outcome: ChildOutcome,
        abandoned: tuple[str, ...],
        notes: tuple[str, ...],
    ) -> bool:
        """Record how the child ``task`` ended; finish if it was the last.

        Returns:
            bool: whether the report is written.
        """
        reports: tuple[CancelReport, ...] = ()
        if outcome is not ChildOutcome.FINISHED:
            self._notice_hard_cancel(outcome, exc)
            # only a hard-cancelled child can have left a waiting caller's report
            reports = _reports_left_by(task)
        now = trio.current_time()
        self.ended.append(
            ChildEnd(
                name=task.name,
                outcome=outcome,
                ended_at=now,
                elapsed=now - self.started_at,
                error=repr(exc) if outcome is ChildOutcome.RAISED else None,
                abandoned=abandoned,
                notes=notes,
                reports=reports,
            )
        )
        return self.finish_if_done()

    def finish_if_done(self) -> bool:
        """Write the report if no child is left; tell whether it is written."""
        if self.report is not None:
            return True
        if self._levels.live:
            return False
        self.report = CancelReport(
            bundle=self._name,
            started_at=self.started_at,
            finished_at=trio.current_time(),
            hard_deadline=self.deadline,
            hard_cancelled_at=self.hard_cancelled_at,
            children=tuple(self.ended),
        )
        summary = self.report.summary(name=self._path)
        logger.log(
            self._log_level(abandoned=bool(self.report.abandoned)), "%s", summary
        )
        if tracing.active:
            emit(TraceKind.CANCEL_FINISHED, self._path, detail=summary)
        for caller in self._cancelled_callers:
            _leave_report(caller, self.report)
        self._cancelled_callers.clear()
        self._all_done.set()
        return True

    # -- waiting -------------------------------------------------------------------

    async def wait(self) -> CancelReport:
        """Wait until every child has ended; return the report.

        The first caller drives (see the module docstring); later ones just
        wait. If the caller is cancelled, the children are hard-cancelled at
        once, and the report, once written, is left for the caller's entry in
        its own bundle's report. This is a checkpoint.
        """
        try:
            if self._driver is None and self.report is None:
                await self._drive()
            else:
                await self._all_done.wait()
        except BaseException:
            caller = trio.lowlevel.current_task()
            if self.report is None:
                self._cancelled_callers.append(caller)
            else:
                _leave_report(caller, self.report)
            self.hard_cancel(
                f"the task waiting in cancel() of bundle {self._name!r} was cancelled"
            )
            raise
        assert self.report is not None
        return self.report

    async def _drive(self) -> None:
        # Without trace hooks and with progress logging off this is a single
        # wait: the caller is woken by the last child, never by a timer.
        level = self._log_level()
        now = trio.current_time()
        progress_due = (
            now + PROGRESS_INTERVAL if logger.isEnabledFor(level) else math.inf
        )
        try:
            while True:
                due = progress_due
                if tracing.active and self.hard_cancelled_at is None:
                    due = min(due, self.deadline)
                self._driver = trio.CancelScope(deadline=due)
                with self._driver:
                    await self._all_done.wait()
                if self._all_done.is_set():
                    return
                now = trio.current_time()
                if now >= self.deadline:
                    self._note_hard_cancel(self.deadline, "the grace period ran out")
                if now >= progress_due:
                    progress_due = now + PROGRESS_INTERVAL
                    self._log_progress(level, now)
        finally:
            self._driver = None

    def _log_progress(self, level: int, now: float) -> None:
        live = self._levels.live
        left = self.deadline - now
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
