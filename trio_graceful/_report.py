"""Values that describe what a bundle's cancellation did."""

from __future__ import annotations

import enum

import attrs


class ChildOutcome(enum.Enum):
    """How a child of a bundle ended while the bundle was being cancelled."""

    FINISHED = "finished"
    """The child returned by itself before the bundle hard-cancelled it."""

    CANCELLED = "cancelled"
    """The child was hard-cancelled; it ended after the hard cancel reached it."""

    RAISED = "raised"
    """The child raised an exception other than `trio.Cancelled`."""


@attrs.frozen
class ChildEnd:
    """One child's line in a `CancelReport`."""

    name: str
    """The child task's name (`trio.lowlevel.Task.name`)."""

    outcome: ChildOutcome
    """How the child ended."""

    ended_at: float
    """When the child ended, in Trio time (`trio.current_time`)."""

    elapsed: float
    """Seconds from the start of the cancellation to the child's end."""

    error: str | None = None
    """``repr()`` of the exception for `ChildOutcome.RAISED`, else `None`."""

    abandoned: tuple[str, ...] = ()
    """Work the child had to leave running when it was hard-cancelled, such
    as a thread that cannot be killed, as recorded with `Bundle.note_abandoned`."""

    notes: tuple[str, ...] = ()
    """Anything else the child recorded about its end with `Bundle.note`
    (a process's exit status, say)."""


@attrs.frozen
class CancelReport:
    """What one cancellation of a bundle did, returned by `Bundle.cancel`.

    It lists every child that was running when the cancellation started or
    that was started while it ran, in the order they ended. Children that
    ended before the cancellation started are not listed.
    """

    bundle: str
    """The bundle's name."""

    started_at: float
    """When the first `Bundle.cancel` call started, in Trio time."""

    finished_at: float
    """When the last child ended, in Trio time."""

    hard_deadline: float
    """The hard deadline in Trio time, the earliest ``started + grace`` asked for."""

    hard_cancelled_at: float | None
    """When the children were hard-cancelled, or `None` if they all ended in time."""

    children: tuple[ChildEnd, ...]
    """One entry per child, in the order the children ended."""

    @property
    def elapsed(self) -> float:
        """Seconds from the start of the cancellation to the last child's end."""
        return self.finished_at - self.started_at

    @property
    def abandoned(self) -> tuple[str, ...]:
        """Everything the children left running (threads, say), in order."""
        return tuple(name for c in self.children for name in c.abandoned)

    @property
    def graceful(self) -> bool:
        """True if no child had to be hard-cancelled and none raised."""
        return all(c.outcome is ChildOutcome.FINISHED for c in self.children)

    def count(self, outcome: ChildOutcome) -> int:
        """Return how many children ended with ``outcome``."""
        return sum(1 for c in self.children if c.outcome is outcome)

    def summary(self, *, name: str | None = None) -> str:
        """Return a one-line, human-readable summary of the report.

        Args:
            name (str or None): What to call the bundle, such as its path;
                its `bundle` name by default.
        """
        return (
            f"bundle {self.bundle if name is None else name!r}: "
            f"{self.count(ChildOutcome.FINISHED)} finished, "
            f"{self.count(ChildOutcome.CANCELLED)} hard-cancelled, "
            f"{self.count(ChildOutcome.RAISED)} raised, "
            + (f"{len(self.abandoned)} abandoned, " if self.abandoned else "")
            + f"in {self.elapsed:.3f} s"
        )


@attrs.frozen
class BundleStatistics:
    """A snapshot of a bundle's state, returned by `Bundle.statistics`."""

    children_running: int
    """Children that have been started and have not ended yet (including
    children still starting under `Bundle.start`)."""

    cancelling: bool
    """True from the first `Bundle.cancel` call until the bundle closes."""

    closed: bool
    """True once the bundle accepts no new children."""

    hard_deadline: float
    """The hard deadline in Trio time, `math.inf` when not cancelling."""

    inboxes: int
    """Inboxes opened with `Bundle.open_inbox` that still have a receiver."""
