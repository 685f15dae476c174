"""A bundle's phase: open, cancelling, closed, moved only along one table.

``open`` becomes ``cancelling`` when `Bundle.cancel` is first called;
``cancelling`` becomes ``closed`` when the last child has ended; ``open``
becomes ``closed`` when the block exits without a cancellation. Nothing else
is legal: a move off the table raises and changes nothing.
"""

from __future__ import annotations

import enum
from typing import Final

import attrs


class BundlePhase(enum.Enum):
    """Where a bundle is in its life."""

    OPEN = "open"
    CANCELLING = "cancelling"
    CLOSED = "closed"


# The phases a bundle may move to from each phase.
NEXT_PHASES: Final[dict[BundlePhase, frozenset[BundlePhase]]] = {
    BundlePhase.OPEN: frozenset({BundlePhase.CANCELLING, BundlePhase.CLOSED}),
    BundlePhase.CANCELLING: frozenset({BundlePhase.CLOSED}),
    BundlePhase.CLOSED: frozenset(),
}


@attrs.define(eq=False)
class PhaseRecord:
    """The phase of one bundle and, once it is closed, why."""

    _name: str
    phase: BundlePhase = BundlePhase.OPEN
    _closed_reason: str = ""

    def move_to(self, phase: BundlePhase) -> None:
        """Go to ``phase``; see the table in the module docstring.

        Raises:
            RuntimeError: if the table has no such move.
        """
        if phase not in NEXT_PHASES[self.phase]:
            raise RuntimeError(
                f"bundle {self._name!r} cannot go from {self.phase.value} to "
                f"{phase.value}"
            )
        self.phase = phase

    def close(self, reason: str) -> None:
        """Close the bundle, saying ``reason`` to later starters, unless it is."""
        if self.phase is not BundlePhase.CLOSED:
            self.move_to(BundlePhase.CLOSED)
            self._closed_reason = reason

    def check_open(self, consequence: str = "no new tasks can be started") -> None:
        """Raise `RuntimeError` with the reason if the bundle is closed.

        The message says why it is closed and ``consequence``, what the
        refused call would have meant.
        """
        if self.phase is BundlePhase.CLOSED:
            raise RuntimeError(
                f"bundle {self._name!r} is closed: {self._closed_reason}; {consequence}"
            )
