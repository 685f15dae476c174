"""The stop budget: fitting the drain delay, the grace and the unwind into it.

An orchestrator gives a program a fixed time between its stop signal and
SIGKILL: Kubernetes' ``terminationGracePeriodSeconds``, systemd's
``TimeoutStopSec``, ``docker stop -t``. A `trio_graceful.run` shutdown takes
at most ``drain_delay + grace + unwind_budget`` from the first signal, and
the watchdog's emergency exit up to `WATCHDOG_MARGIN` more (a thread still
busy gets a second of running time, the report a second): `StopTimes.total`,
from the one sum of ``_stoptime``. That must fit in the budget, or the
orchestrator's SIGKILL comes first: no emergency report, no exit
status, the drain cut at a moment nobody chose.

`fit_stop_budget` is the policy when it does not fit: the grace is shortened
first (the drain delay is what keeps a rolling restart free of refused
connections, and the unwind budget is the last resort that reports what
hung), then the drain delay, then the unwind budget.
"""

from __future__ import annotations

from ._stoptime import WATCHDOG_MARGIN as WATCHDOG_MARGIN, StopTimes as StopTimes


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
