"""What the exit guard is armed with as a run that took a signal returns.

The policy, apart from the guard's mechanism (``_guard``): the process
must end within the stop time of its first signal, or at its next signal,
with the statuses of the run's `ExitCodes`.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Mapping
from typing import Any, Final

from ..._core._lowlevel import signal_name
from .._options._runoptions import RunSettings
from .._shutdown._stoptime import REPORT_TIMEOUT
from .._signals._escalation import Escalation
from ._guard import exit_guard

SHOW_INTERNALS_VARIABLE: Final = "TRIO_GRACEFUL_SHOW_INTERNALS"
"""Set to a non-empty value other than ``0`` to show the frames of trio and
trio_graceful in the emergency report."""


def bound_the_exit(
    previous: Mapping[int, Any],
    late: list[int],
    settings: RunSettings,
    escalation: Escalation,
    status: int | None,
) -> None:
    """Arm the exit guard as a run that took a signal returns (see ``_guard``).

    The process must end within the stop time of the first signal, or at
    the next one, with 128 + its number.
    """
    codes = settings.options.exit_codes
    # As long as the shutdown may take, the watchdog's allowance for a busy
    # thread included (a run may return that late), the report's not: the
    # guard's own report comes after.
    stop = settings.times.total - REPORT_TIMEOUT
    first, since = escalation.first_signal, escalation.first_signal_at
    after = "the run" if first is None else signal_name(first)
    exit_guard().arm(
        previous,
        late,
        status=codes.error if status is None else status,
        late_status=functools.partial(codes.after_signal, forced=True),
        deadline=(time.monotonic() if since is None else since) + stop,
        stop_time=f"{stop:g} s after {after}",
        internals=show_internals(),
    )


def show_internals() -> bool:
    """Whether reports show the frames of trio and trio_graceful (the variable)."""
    return os.environ.get(SHOW_INTERNALS_VARIABLE, "") not in ("", "0")
