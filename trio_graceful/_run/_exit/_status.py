"""The exit status of a program run by `trio_graceful.run`, and why it is what it is.

The run records what decides its exit status the moment it happens: a
failure, a `SystemExit` from ``main``, a root task or a service
(`EndingRecorder`; the first of each kind wins; `split_exits` and
`interrupt_of` sort what the root bundle raised into those kinds). Once the
run is over, the status is a pure function of how it ended: `exit_status` of
an `Ending` and the run's `ExitCodes`, and `exit_reason` says why.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from typing import Literal, cast, final

import attrs
import trio

from ..._core._checks import check_bool, check_int, check_signal, field_check
from ..._core._groups import as_group, first_leaf
from ..._core._log import library_logger
from ..._core._lowlevel import signal_name

logger = library_logger("trio_graceful.runner")


def _exit_status(argument: str, value: object) -> int:
    status = check_int(argument, value)
    if not 0 <= status <= 255:
        raise ValueError(f"{argument} must be from 0 to 255, not {value!r}")
    return status


_check_status = field_check(_exit_status)
_check_bool = field_check(check_bool)


def _to_signal_set(value: object) -> frozenset[int]:
    if isinstance(value, (int, str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"clean_signals must be a collection of signals, not {value!r}")
    result: set[int] = set()
    for item in cast("Iterable[object]", value):
        if isinstance(item, bool) or not isinstance(item, int):
            raise TypeError(f"clean_signals must hold signal numbers, not {item!r}")
        result.add(int(item))
    return frozenset(result)


@attrs.frozen
class ExitCodes:
    """The exit statuses `trio_graceful.run` returns; pass your own to change them.

    The defaults follow the conventions of shells and service managers:

    * ``0`` when ``main`` returned, or after a graceful shutdown asked for
      by SIGTERM (or another of `clean_signals`), or by
      `Runner.request_shutdown`: the program did what it was asked to do.
    * ``128 + n`` after signal *n* otherwise: 130 after Ctrl+C (SIGINT),
      which is what a shell reports for a program that Ctrl+C interrupted, so
      ``tool && next`` does not go on as if ``tool`` had finished its job;
      143 after SIGTERM when the shutdown had to be forced (the grace ran out
      or a second signal came): the program did not stop cleanly.
    * `error` (1, as Python uses for an uncaught exception) when ``main``,
      a task of the root bundle or a service raised.
    * `startup_failed` (also 1 by default) when the program never became
      ready: ``main`` or a service raised while starting, or the startup
      timed out. Give it its own value if a service manager should tell the
      two apart (systemd's ``RestartPreventExitStatus=``, say).
    * `emergency` (137, what a supervisor reports for a process killed with
      SIGKILL, which is what the emergency exit stands in for) when the
      watchdog ended a process that could not unwind.

    ``SystemExit`` raised by ``main`` sets the status as it would for a
    plain Python program, unless something also failed.
    """

    ok: int = attrs.field(default=0, validator=_check_status)
    """``main`` returned, or a clean signal's graceful shutdown finished in time."""

    error: int = attrs.field(default=1, validator=_check_status)
    """``main``, a root task or a service raised after the program was ready."""

    startup_failed: int = attrs.field(default=1, validator=_check_status)
    """The program never became ready, after an error or a timeout during startup."""

    emergency: int = attrs.field(default=128 + signal.SIGKILL, validator=_check_status)
    """The watchdog ended the process with ``os._exit``."""

    clean_signals: frozenset[int] = attrs.field(
        default=frozenset({signal.SIGTERM}), converter=_to_signal_set
    )
    """Signals after which a graceful shutdown that finished in time exits with `ok`.

    Any other signal gives ``128 + signum``, and so does a clean signal whose
    shutdown had to be forced.
    """

    clean_after_grace: bool = attrs.field(default=False, validator=_check_bool)
    """Whether a clean signal's shutdown that was forced only because the
    grace ran out still exits with `ok`.

    False by default: such a program did not stop by itself. A server whose
    grace is there to cut off clients that never say goodbye sets it: it
    stopped within its bounds. A second signal always counts as forced.
    """

    def after_signal(
        self, signum: int, *, forced: bool, grace_ran_out: bool = False
    ) -> int:
        """The status after a shutdown that signal ``signum`` started.

        Args:
            signum (int): The first signal received.
            forced (bool): Whether the shutdown had to hard-cancel (the grace
                ran out, or a second signal came).
            grace_ran_out (bool): Whether it was forced by the grace running
                out, not by a signal (see `clean_after_grace`).

        Raises:
            TypeError: if ``signum`` is not an int.
            ValueError: if ``signum`` is not a valid signal number.
        """
        check_signal("signum", signum)
        if signum in self.clean_signals and (
            not forced or (grace_ran_out and self.clean_after_grace)
        ):
            return self.ok
        return 128 + signum


@attrs.frozen
class Ending:
    """How a run ended: the facts `exit_status` chooses the status from."""

    failure: Literal["error", "startup"] | None = None
    """The first failure: after the program was ready, or during startup."""

    system_exit: tuple[object] | None = None
    """``(code,)`` of a `SystemExit` raised by ``main`` or a root task."""

    first_signal: int | None = None
    """The signal that began the shutdown, if one did."""

    forced_by: Literal["grace", "signal"] | None = None
    """Whether the shutdown was forced, and by what."""


def exit_status(codes: ExitCodes, ending: Ending) -> int:
    """The exit status of a run that ended as ``ending`` says.

    A failure wins, then `SystemExit` (its code as Python would use it, and
    `ExitCodes.error` for a message), then the first signal, else
    `ExitCodes.ok`.
    """
    if ending.failure is not None:
        return codes.startup_failed if ending.failure == "startup" else codes.error
    if ending.system_exit is not None:
        (code,) = ending.system_exit
        if code is None:
            return codes.ok
        if isinstance(code, int):
            return code
        return codes.error  # as Python does for SystemExit("message")
    if ending.first_signal is not None:
        return codes.after_signal(
            ending.first_signal,
            forced=ending.forced_by is not None,
            grace_ran_out=ending.forced_by == "grace",
        )
    return codes.ok


def exit_reason(ending: Ending) -> str | None:
    """Why a run that ended as ``ending`` exits, for the log; None for no reason.

    It names what `exit_status` chose the status from: ``startup failed``,
    ``error``, ``SystemExit(3)``, the first signal (and what forced the
    shutdown); None when ``main`` returned by itself.
    """
    if ending.failure is not None:
        return "startup failed" if ending.failure == "startup" else "error"
    if ending.system_exit is not None:
        return f"SystemExit({ending.system_exit[0]!r})"
    if ending.first_signal is not None:
        name = signal_name(ending.first_signal)
        if ending.forced_by == "grace":
            return f"{name}, forced when the grace ran out"
        if ending.forced_by == "signal":
            return f"{name}, forced by another signal"
        return name
    return "the grace ran out" if ending.forced_by == "grace" else None


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
class EndingRecorder:
    """How one run is ending, recorded as it happens (see the module docstring).

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
