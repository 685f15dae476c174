"""The stop time: the longest a shutdown can still take, from any point of it.

A shutdown has three parts, one after the other: the drain delay (a program
that was ready serves on, withdrawn from rotation), the grace (the graceful
drain) and the unwind budget (a hard cancel unwinds). From any point of it,
the longest it can still take is what is left of the part under way plus the
whole of every part after it, then the watchdog's emergency exit, which may
take up to `WATCHDOG_MARGIN` more. `StopTimes.time_left` is that sum and the
one place it is written: the watchdog arms its deadline with it, the probes
tell the service manager with it how long to wait, and the stop budget
(``_budget``) checks that the whole of it fits.
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
