"""The stop time: the longest a shutdown can still take, and the budget it must fit.

A shutdown has three parts, one after the other: the drain delay (a program
that was ready serves on, withdrawn from rotation), the grace (the graceful
drain) and the unwind budget (a hard cancel unwinds). From any point of it,
the longest it can still take is what is left of the part under way plus the
whole of every part after it, then the watchdog's emergency exit, which may
take up to `WATCHDOG_MARGIN` more. `StopTimes.time_left` is that sum and the
one place it is written: the watchdog arms its deadline with it, the probes
tell the service manager with it how long to wait, and the stop budget
checks that the whole of it fits.

The stop budget is the time an orchestrator gives a program between its
stop signal and SIGKILL: Kubernetes' ``terminationGracePeriodSeconds``,
systemd's ``TimeoutStopSec``, ``docker stop -t``. `StopTimes.total` must
fit in it, or the orchestrator's SIGKILL comes first: no emergency report,
no exit status, the drain cut at a moment nobody chose. `fit_stop_budget` is
the policy when it does not fit: the grace is shortened first (the drain
delay is what keeps a rolling restart free of refused connections, and the
unwind budget is the last resort that reports what hung), then the drain
delay, then the unwind budget.
"""

from __future__ import annotations

import enum
import math
from typing import Final

import attrs

REPORT_TIMEOUT: Final = 1.0
"""Seconds the emergency report may take before ``os._exit`` runs anyway."""

BUSY_ALLOWANCE: Final = 1.0
"""Seconds past its deadline the watchdog gives a Trio thread that is busy."""

WATCHDOG_MARGIN: Final = BUSY_ALLOWANCE + REPORT_TIMEOUT
"""Seconds the emergency exit may take past the unwind budget."""


class Part(enum.Enum):
    """The parts of a shutdown, in the order they run."""

    DRAIN_DELAY = "drain delay"
    GRACE = "grace"
    UNWIND = "unwind budget"


_ORDER: Final = tuple(Part)


@attrs.frozen
class StopTimes:
    """The three parts of a shutdown, in seconds, and the budget that holds them."""

    drain_delay: float
    grace: float
    unwind_budget: float
    stop_budget: float = math.inf

    def time_left(self, part: Part, left: float | None = None) -> float:
        """The longest the shutdown can still take from a point in ``part``.

        Args:
            part (Part): The part under way.
            left (float or None): Seconds left of it; None for all of it
                (the part begins now).

        Returns:
            ``left``, plus the whole of each later part; not counting the
            emergency exit's `WATCHDOG_MARGIN`.
        """
        lengths = {
            Part.DRAIN_DELAY: self.drain_delay,
            Part.GRACE: self.grace,
            Part.UNWIND: self.unwind_budget,
        }
        index = _ORDER.index(part)
        total = lengths[part] if left is None else left
        for later in _ORDER[index + 1 :]:
            total += lengths[later]
        return total

    @property
    def total(self) -> float:
        """The longest a shutdown can take after the first signal."""
        return self.time_left(Part.DRAIN_DELAY) + WATCHDOG_MARGIN

    def arithmetic(self) -> str:
        """The sum, written out for the log: ``drain_delay 5 + grace 30 + ...``."""
        return (
            f"drain_delay {self.drain_delay:g} s + grace {self.grace:g} s + "
            f"unwind_budget {self.unwind_budget:g} s + {WATCHDOG_MARGIN:g} s for "
            f"the emergency exit = {self.total:g} s"
        )


def fit_stop_budget(times: StopTimes) -> tuple[StopTimes, str | None]:
    """Shorten the parts of ``times`` until they fit its stop budget.

    Returns:
        The times that fit (``times`` itself when they already do), and a
        warning that states the arithmetic and what was shortened, or None.
        The warning also says when the grace was shortened to 0 (no graceful
        shutdown at all), and when even the shortened times do not fit (a
        budget below `WATCHDOG_MARGIN`).
    """
    budget = times.stop_budget
    if times.total <= budget:
        return times, None
    left = max(0.0, budget - WATCHDOG_MARGIN)
    unwind = min(times.unwind_budget, left)
    left -= unwind
    delay = min(times.drain_delay, left)
    left -= delay
    grace = min(times.grace, left)
    fitted = StopTimes(
        drain_delay=delay, grace=grace, unwind_budget=unwind, stop_budget=budget
    )
    changes = [
        f"{name} {before:g} s -> {after:g} s"
        for name, before, after in (
            ("grace", times.grace, grace),
            ("drain_delay", times.drain_delay, delay),
            ("unwind_budget", times.unwind_budget, unwind),
        )
        if before != after
    ]
    warning = (
        f"the shutdown does not fit the stop budget of {budget:g} s: "
        f"{times.arithmetic()}; shortened to fit: {', '.join(changes)}"
    )
    if fitted.total > budget:
        warning += (
            f"; it still does not fit: the emergency exit alone takes "
            f"{WATCHDOG_MARGIN:g} s, so SIGKILL may come before the report and "
            f"the exit status; give a stop budget of at least "
            f"{WATCHDOG_MARGIN:g} s"
        )
    if grace == 0 < times.grace:
        warning += (
            "; the grace is now 0: at the shutdown main and its tasks are "
            "hard-cancelled at once, with no time to finish their work"
        )
    return fitted, warning
