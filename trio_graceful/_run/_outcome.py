"""How a run ends, as it happens: its first failure, its first `SystemExit`.

The run writes here what decides its exit status the moment it happens (a
failure, a `SystemExit` from ``main``, a root task or a service), and asks
for the status once the run is over (`Outcome.exit_status`, through the pure
``_exitcodes.exit_status``). The first of each kind wins. The helpers below
sort what the root bundle raised into those kinds.
"""

from __future__ import annotations

from typing import Literal, final

import trio

from .._core._groups import as_group, first_leaf
from .._core._log import library_logger
from ._exitcodes import Ending, ExitCodes, exit_reason, exit_status

logger = library_logger("trio_graceful.runner")


def interrupt_of(exc: BaseException) -> BaseException | None:
    """The first KeyboardInterrupt of a group holding nothing else but Cancelled."""
    group = as_group(exc)
    if group is None:
        return None
    interrupts, rest = group.split(KeyboardInterrupt)
    if interrupts is None or (rest is not None and rest.split(trio.Cancelled)[1]):
        return None
    return first_leaf(interrupts)


def split_exits(
    exc: BaseException,
) -> tuple[SystemExit | None, BaseException | None]:
    """The first `SystemExit` in ``exc``, and the rest of it (``exc`` if whole).

    Returns:
        ``(exit, failure)``: either may be None. ``failure`` is ``exc``
        itself when it holds no `SystemExit`, else what is left of it.
    """
    exits: BaseException | None
    rest: BaseException | None
    group = as_group(exc)
    if group is not None:
        exits, rest = group.split(SystemExit)
    else:
        exits, rest = (exc, None) if isinstance(exc, SystemExit) else (None, exc)
    leaf = None if exits is None else first_leaf(exits)
    assert leaf is None or isinstance(leaf, SystemExit)
    return leaf, (exc if exits is None else rest)


@final
class Outcome:
    """How one run is ending (see the module docstring).

    Args:
        exit_codes: The run's exit statuses.
    """

    def __init__(self, exit_codes: ExitCodes) -> None:
        self._exit_codes = exit_codes
        self._failure: Literal["error", "startup"] | None = None
        self._system_exit: tuple[object] | None = None

    def failed(self, *, startup: bool) -> None:
        """Record a failure, during the startup or after it, unless one came first."""
        if self._failure is None:
            self._failure = "startup" if startup else "error"

    def exited(self, exc: SystemExit) -> None:
        """Record ``exc``'s code, unless a `SystemExit` came first."""
        if self._system_exit is None:
            self._system_exit = (exc.code,)

    def exit_status(
        self,
        *,
        first_signal: int | None,
        forced_by: Literal["grace", "signal"] | None,
    ) -> tuple[int, str]:
        """The run's exit status, and the line that says it and why (`exit_reason`).

        Logs the message of a ``SystemExit("message")``.
        """
        code = self._system_exit[0] if self._system_exit is not None else None
        if self._failure is None and not (code is None or isinstance(code, int)):
            logger.error("%s", code)  # as Python prints SystemExit("message")
        ending = Ending(
            failure=self._failure,
            system_exit=self._system_exit,
            first_signal=first_signal,
            forced_by=forced_by,
        )
        status, reason = exit_status(self._exit_codes, ending), exit_reason(ending)
        why = "" if reason is None else f": {reason}"
        return status, f"exiting with status {status}{why}"
