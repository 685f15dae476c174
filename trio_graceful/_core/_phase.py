"""A bundle's phase: open, cancelling, closed, moved only along one table.

``open`` becomes ``cancelling`` when `Bundle.cancel` is first called;
``cancelling`` becomes ``closed`` when the last child has ended; ``open``
becomes ``closed`` when the block exits without a cancellation. Nothing else
is legal: a move off the table raises `IllegalTransitionError` and changes
nothing.
"""

from __future__ import annotations

import enum
from typing import Final

import attrs

from ._statetable import StateTable


class BundlePhase(enum.Enum):
    """Where a bundle is in its life."""

    OPEN = "open"
    CANCELLING = "cancelling"
    CLOSED = "closed"


class PhaseEvent(enum.Enum):
    """What moves a bundle from one phase to the next."""

    CANCEL = "begin cancelling"
    CLOSE = "close"


PHASES: Final = StateTable[BundlePhase, PhaseEvent](
    {
        (BundlePhase.OPEN, PhaseEvent.CANCEL): BundlePhase.CANCELLING,
        (BundlePhase.OPEN, PhaseEvent.CLOSE): BundlePhase.CLOSED,
        (BundlePhase.CANCELLING, PhaseEvent.CLOSE): BundlePhase.CLOSED,
    },
    BundlePhase,
)


@attrs.define(eq=False)
class PhaseRecord:
    """The phase of one bundle and, once it is closed, why."""

    _name: str
    phase: BundlePhase = BundlePhase.OPEN
    _closed_reason: str = ""

    def begin_cancelling(self) -> None:
        """Go from open to cancelling, if the bundle is open.

        A cancellation that starts once the bundle is closed (its block has
        exited, and every child has ended) has nothing to wait for: the
        phase stays closed.
        """
        if self.phase is BundlePhase.OPEN:
            self.phase = PHASES.move(
                self.phase, PhaseEvent.CANCEL, subject=f"bundle {self._name!r}"
            )

    def close(self, reason: str) -> None:
        """Close the bundle, saying ``reason`` to later starters, unless it is."""
        if self.phase is not BundlePhase.CLOSED:
            self.phase = PHASES.move(
                self.phase, PhaseEvent.CLOSE, subject=f"bundle {self._name!r}"
            )
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
