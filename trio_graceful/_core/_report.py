"""Values that describe what a bundle's cancellation did, and their JSON form.

Times in a report are Trio times (`trio.current_time`), which mean nothing
outside the run (and are virtual under a mock clock). The JSON form adds
wall-clock times beside them, from an offset taken when the report is made:
``wall = trio_time + (time.time() - trio.current_time())``. A duration is the
same on both clocks; under a mock clock the wall-clock times are the virtual
ones, placed so that the report's end is the real moment it was made.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import attrs

from ._jsonform import (
    check_mapping,
    current_wall_clock_offset,
    dump_json,
    enum_from_json,
    float_from_json,
    float_to_json,
    list_from_json,
    load_json_object,
    optional_enum_from_json,
    optional_float_from_json,
    str_from_json,
    strings_from_json,
    wall,
)


class ChildOutcome(enum.Enum):
    """How a child of a bundle ended while the bundle was being cancelled."""

    FINISHED = "finished"
    """The child returned by itself before the bundle hard-cancelled it."""

    CANCELLED = "cancelled"
    """The child was hard-cancelled; it ended after the hard cancel reached it."""

    RAISED = "raised"
    """The child raised an exception other than `trio.Cancelled`."""


class HardCancelCause(enum.Enum):
    """Why a bundle's children were hard-cancelled (`CancelReport.hard_cancel_cause`).

    Recorded where the hard cancel starts, once: the first cause is the one
    reported, whatever comes after it.
    """

    GRACE_EXPIRED = "grace_expired"
    """The hard deadline passed with children still running."""

    NO_GRACE = "no_grace"
    """`Bundle.cancel` or `Bundle.shutdown` was called with a grace of 0, as
    the runner does to force its shutdown at a second signal."""

    CALLER_CANCELLED = "caller_cancelled"
    """A task waiting in `Bundle.cancel` (or `Bundle.shutdown`) was cancelled."""

    CHILD_RAISED = "child_raised"
    """A child raised an exception other than `trio.Cancelled`, which
    cancels its siblings, as in a nursery."""

    CANCELLED_FROM_OUTSIDE = "cancelled_from_outside"
    """The children were cancelled from outside the cancellation, by the
    bundle's `Bundle.cancel_scope` or by a scope around the bundle."""


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

    reports: tuple[CancelReport, ...] = ()
    """The reports of the bundles whose `Bundle.cancel` (or `Bundle.shutdown`)
    the child was waiting in when it was hard-cancelled, so that what they
    did is not lost with the child's `trio.Cancelled`; in the order they
    were written."""

    def as_dict(self, *, wall_clock_offset: float | None = None) -> dict[str, Any]:
        """Return this entry as a dictionary of JSON values.

        The outcome is its string value (``"finished"``); ``ended_at_wall``
        is the wall-clock time of ``ended_at`` (seconds since the epoch), or
        `None` if ``wall_clock_offset`` is `None`.
        """
        return {
            "name": self.name,
            "outcome": self.outcome.value,
            "ended_at": float_to_json(self.ended_at),
            "ended_at_wall": wall(self.ended_at, wall_clock_offset),
            "elapsed": float_to_json(self.elapsed),
            "error": self.error,
            "abandoned": list(self.abandoned),
            "notes": list(self.notes),
            "reports": [report.as_dict() for report in self.reports],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChildEnd:
        """Rebuild an entry from `as_dict`'s output; wall-clock times are ignored.

        Raises:
            TypeError: if ``data`` is not a mapping.
            ValueError: if a field is missing or holds the wrong kind of value.
        """
        data = check_mapping(data, "data")
        return cls(
            name=str_from_json(data, "name", optional=False) or "",
            outcome=enum_from_json(ChildOutcome, data, "outcome"),
            ended_at=float_from_json(data, "ended_at"),
            elapsed=float_from_json(data, "elapsed"),
            error=str_from_json(data, "error", optional=True),
            abandoned=strings_from_json(data, "abandoned"),
            notes=strings_from_json(data, "notes"),
            reports=tuple(
                CancelReport.from_dict(report)
                for report in list_from_json(data, "reports")
            ),
        )


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

    hard_cancel_cause: HardCancelCause | None
    """Why the children were hard-cancelled, or `None` if they all ended in time."""

    children: tuple[ChildEnd, ...]
    """One entry per child, in the order the children ended."""

    wall_clock_offset: float | None = attrs.field(
        factory=current_wall_clock_offset, kw_only=True
    )
    """What to add to this report's Trio times to get wall-clock times
    (seconds since the epoch), taken when the report was made; `None` for a
    report made outside a Trio run."""

    def as_dict(self) -> dict[str, Any]:
        """Return the report as a dictionary of JSON values.

        Beside each Trio time ``x`` stands ``x_wall``, the same instant on
        the wall clock (seconds since the epoch, see `wall_clock_offset`).
        JSON has no infinity: an infinite deadline is written ``"inf"``.
        Enums are written as their values: ``"hard_cancel_cause":
        "grace_expired"``, or ``null``. Not a checkpoint.
        """
        offset = self.wall_clock_offset
        return {
            "bundle": self.bundle,
            "started_at": float_to_json(self.started_at),
            "started_at_wall": wall(self.started_at, offset),
            "finished_at": float_to_json(self.finished_at),
            "finished_at_wall": wall(self.finished_at, offset),
            "hard_deadline": float_to_json(self.hard_deadline),
            "hard_deadline_wall": wall(self.hard_deadline, offset),
            "hard_cancelled_at": (
                None
                if self.hard_cancelled_at is None
                else float_to_json(self.hard_cancelled_at)
            ),
            "hard_cancelled_at_wall": wall(self.hard_cancelled_at, offset),
            "hard_cancel_cause": (
                None if self.hard_cancel_cause is None else self.hard_cancel_cause.value
            ),
            "wall_clock_offset": offset,
            "children": [
                child.as_dict(wall_clock_offset=offset) for child in self.children
            ],
        }

    def to_json(self, *, indent: int | None = None) -> str:
        """Return the report as JSON text (see `as_dict`). Not a checkpoint.

        Raises:
            TypeError: if ``indent`` is not an int or None.
        """
        return dump_json(self.as_dict(), indent)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CancelReport:
        """Rebuild a report from `as_dict`'s output.

        The wall-clock times are derived, so they are not read back.

        Raises:
            TypeError: if ``data`` is not a mapping.
            ValueError: if a field is missing or holds the wrong kind of value.
        """
        data = check_mapping(data, "data")
        return cls(
            bundle=str_from_json(data, "bundle", optional=False) or "",
            started_at=float_from_json(data, "started_at"),
            finished_at=float_from_json(data, "finished_at"),
            hard_deadline=float_from_json(data, "hard_deadline"),
            hard_cancelled_at=optional_float_from_json(data, "hard_cancelled_at"),
            hard_cancel_cause=optional_enum_from_json(
                HardCancelCause, data, "hard_cancel_cause"
            ),
            children=tuple(
                ChildEnd.from_dict(c) for c in list_from_json(data, "children")
            ),
            wall_clock_offset=optional_float_from_json(data, "wall_clock_offset"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> CancelReport:
        """Rebuild a report from `to_json`'s output.

        Raises:
            TypeError: if ``text`` is not a str or bytes.
            ValueError: if it is not JSON of a report.
        """
        return cls.from_dict(load_json_object(text))

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
