"""The checked arguments of `trio_graceful.run`: every one refused at the call.

`check_run_arguments` turns what the caller passed into a frozen `RunOptions`,
or raises `TypeError` / `ValueError` naming the argument and the value, before
any thread, handler or Trio run exists.
"""

from __future__ import annotations

import functools
import inspect
import math
import signal
from collections.abc import Awaitable, Callable, Collection
from typing import Final, cast

import attrs
import trio

from .._children._admission import check_count
from .._core._util import check_name, check_port, check_seconds, is_async_def
from ._budget import StopTimes, fit_stop_budget
from ._escalation import SecondSignal
from ._exitcodes import ExitCodes

# Signals whose handlers cannot be changed.
_UNCATCHABLE: Final = frozenset({signal.SIGKILL, signal.SIGSTOP})


@attrs.frozen
class RunOptions:
    """What `trio_graceful.run` was asked to do, checked."""

    name: str
    grace: float
    unwind_budget: float
    drain_delay: float
    stop_budget: float
    health_port: int | None
    health_host: str | None
    health_max_connections: int
    startup_timeout: float
    signals: tuple[int, ...]
    exit_codes: ExitCodes
    clock: trio.abc.Clock | None
    second_signal: SecondSignal
    takes_task_status: bool


def takes_task_status(fn: Callable[..., object]) -> bool:
    """Whether ``fn`` accepts a ``task_status`` keyword argument."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins and other opaque callables
        return False
    parameter = parameters.get("task_status")
    return parameter is not None and parameter.kind in (
        inspect.Parameter.KEYWORD_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )


def _check_main(main: object) -> None:
    if not callable(main):
        raise TypeError(f"main must be an async function, not {main!r}")
    fn: object = main
    while isinstance(fn, functools.partial):
        fn = cast("functools.partial[object]", fn).func
    function = getattr(fn, "__func__", fn)  # a bound method's function
    if inspect.isfunction(function) and not is_async_def(function):
        raise TypeError(
            f"main must be an async function (async def), not the synchronous {main!r}"
        )


def _check_signals(signals: object) -> tuple[int, ...]:
    if isinstance(signals, (int, str, bytes)) or not isinstance(signals, Collection):
        raise TypeError(f"signals must be a collection of signals, not {signals!r}")
    result: list[int] = []
    for item in cast("Collection[object]", signals):
        if isinstance(item, bool) or not isinstance(item, int):
            raise TypeError(f"signals must hold signal numbers, not {item!r}")
        if item in _UNCATCHABLE or item not in signal.valid_signals():
            raise ValueError(
                f"signals must be signals that can be handled, not {item!r}"
            )
        if item not in result:
            result.append(int(item))
    return tuple(result)


def _check_health(port: object, host: object) -> tuple[int | None, str | None]:
    checked_port = None if port is None else check_port("health_port", port)
    if host is not None and not isinstance(host, str):
        raise TypeError(f"health_host must be a string or None, not {host!r}")
    if host is not None and checked_port is None:
        raise ValueError(
            f"health_host={host!r} needs a health_port (0 picks a free port)"
        )
    return checked_port, host


def check_run_arguments(
    main: Callable[..., Awaitable[object]],
    *,
    grace: object,
    unwind_budget: object,
    startup_timeout: object,
    signals: object,
    exit_codes: object,
    clock: object,
    name: object,
    second_signal: object,
    drain_delay: object,
    stop_budget: object,
    health_port: object,
    health_host: object,
    health_max_connections: object,
) -> tuple[RunOptions, str | None]:
    """Check the arguments of `trio_graceful.run`; see its docstring for the errors.

    Returns:
        The options, and a warning to log at startup if the shutdown had to
        be shortened to fit ``stop_budget`` (see ``_budget``).
    """
    times, budget_warning = fit_stop_budget(
        StopTimes(
            drain_delay=check_seconds("drain_delay", drain_delay),
            grace=check_seconds("grace", grace),
            unwind_budget=check_seconds("unwind_budget", unwind_budget),
            stop_budget=check_seconds("stop_budget", stop_budget),
        )
    )
    checked_port, checked_host = _check_health(health_port, health_host)
    max_connections = check_count("health_max_connections", health_max_connections)
    checked_timeout = check_seconds("startup_timeout", startup_timeout)
    checked_signals = _check_signals(signals)
    _check_main(main)
    if not isinstance(exit_codes, ExitCodes):
        raise TypeError(f"exit_codes must be an ExitCodes, not {exit_codes!r}")
    if clock is not None and not isinstance(clock, trio.abc.Clock):
        raise TypeError(f"clock must be a trio.abc.Clock or None, not {clock!r}")
    check_name(name)
    if second_signal not in ("force", "exit"):
        raise ValueError(
            f'second_signal must be "force" or "exit", not {second_signal!r}'
        )
    task_status = takes_task_status(main)
    if checked_timeout != math.inf and not task_status:
        raise ValueError(
            f"startup_timeout={checked_timeout:g} needs a main that takes "
            f"task_status and calls task_status.started() when it is ready"
        )
    program = name if isinstance(name, str) else getattr(main, "__name__", "main")
    options = RunOptions(
        name=str(program),
        grace=times.grace,
        unwind_budget=times.unwind_budget,
        drain_delay=times.drain_delay,
        stop_budget=times.stop_budget,
        health_port=checked_port,
        health_host=checked_host,
        health_max_connections=max_connections,
        startup_timeout=checked_timeout,
        signals=checked_signals,
        exit_codes=exit_codes,
        clock=clock,
        second_signal=second_signal,
        takes_task_status=task_status,
    )
    return options, budget_warning
