"""The options of `trio_graceful.run`: each one's default and check, defined once.

`RunOptions` is the one definition of what `run` takes besides ``main``:
every field holds its option's default and the check that refuses a bad
value, naming the argument and the value, before any thread, handler or Trio
run exists. The rest is derived from it: `run`'s keyword parameters take
their defaults from `DEFAULT_OPTIONS` (a test compares the two), and the
options a command line may set carry a `CommandLine` in their metadata, from
which ``_arguments`` builds `add_run_arguments` and `run_arguments`.
`settle` then decides, once ``main`` is known, what the run does.
"""

from __future__ import annotations

import functools
import inspect
import math
import signal
from collections.abc import Awaitable, Callable, Collection
from typing import Any, Final, cast

import attrs
import trio

from ..._core._checks import (
    check_count,
    check_name,
    check_port,
    check_seconds,
    field_check,
)
from ..._core._lowlevel import is_async_def
from .._exit._status import ExitCodes
from .._shutdown._stoptime import StopTimes, fit_stop_budget
from .._signals._escalation import SecondSignal

# Signals whose handlers cannot be changed.
_UNCATCHABLE: Final = frozenset({signal.SIGKILL, signal.SIGSTOP})

COMMAND_LINE: Final = "trio_graceful.command_line"
"""The metadata key of an option's `CommandLine`."""


@attrs.frozen
class CommandLine:
    """How an option of `run` is given on a command line (see ``_arguments``)."""

    help: str
    """The option's help, with ``%(default)`` where the default belongs."""

    text_to: Callable[[str], object]
    """Turns the option's text into a value for the field's check; raises
    `ValueError` for text that means nothing."""

    requirement: str
    """What the value must be, for the message that refuses a text."""

    check_speaks: bool = True
    """Whether a value the field's check refuses is refused in the check's own
    words (otherwise with `requirement` and the text)."""

    metavar: str | None = None
    """The name of the value in the help, if not the option's."""


# Each duration's converter is check_seconds with the option's name: it
# refuses a bad value and makes a good one a float. mypy's attrs plugin takes
# only named functions as converters, hence the ignores below.


def _signals(signals: object) -> tuple[int, ...]:
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
            result.append(item)
    return tuple(result)


def _check_exit_codes(
    instance: object, attribute: attrs.Attribute[ExitCodes], value: object
) -> None:
    if not isinstance(value, ExitCodes):
        raise TypeError(f"exit_codes must be an ExitCodes, not {value!r}")


def _check_clock(
    instance: object,
    attribute: attrs.Attribute[trio.abc.Clock | None],
    value: object,
) -> None:
    if value is not None and not isinstance(value, trio.abc.Clock):
        raise TypeError(f"clock must be a trio.abc.Clock or None, not {value!r}")


def _check_second_signal(
    instance: object, attribute: attrs.Attribute[SecondSignal], value: object
) -> None:
    if value not in ("force", "exit"):
        raise ValueError(f'second_signal must be "force" or "exit", not {value!r}')


def _check_host(
    instance: RunOptions, attribute: attrs.Attribute[str | None], value: object
) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"health_host must be a string or None, not {value!r}")
    if value is not None and instance.health_port is None:
        raise ValueError(
            f"health_host={value!r} needs a health_port (0 picks a free port)"
        )


def _duration(help: str) -> dict[str, object]:
    return {COMMAND_LINE: CommandLine(help, float, "a number of seconds")}


@attrs.frozen(kw_only=True)
class RunOptions:
    """The options of `trio_graceful.run` besides ``main``: defaults and checks.

    Creating one checks every option (see `run` for the errors).
    """

    grace: float = attrs.field(
        default=10.0,
        converter=functools.partial(check_seconds, "grace"),  # type: ignore[misc]
        metadata=_duration(
            help="seconds the graceful shutdown may take (default: %(default)g)",
        ),
    )
    unwind_budget: float = attrs.field(
        default=3.0,
        converter=functools.partial(check_seconds, "unwind_budget"),  # type: ignore[misc]
        metadata=_duration(
            help="seconds a hard cancel may take to unwind before the emergency "
            "exit (default: %(default)g)",
        ),
    )
    startup_timeout: float = attrs.field(
        default=math.inf,
        converter=functools.partial(check_seconds, "startup_timeout"),  # type: ignore[misc]
    )
    signals: Collection[int] = attrs.field(
        default=(signal.SIGINT, signal.SIGTERM), converter=_signals
    )
    exit_codes: ExitCodes = attrs.field(factory=ExitCodes, validator=_check_exit_codes)
    clock: trio.abc.Clock | None = attrs.field(default=None, validator=_check_clock)
    name: str | None = attrs.field(default=None, validator=field_check(check_name))
    second_signal: SecondSignal = attrs.field(
        default="force", validator=_check_second_signal
    )
    drain_delay: float = attrs.field(
        default=0.0,
        converter=functools.partial(check_seconds, "drain_delay"),  # type: ignore[misc]
        metadata=_duration(
            help="seconds to go on serving, not ready, after the signal (default: 0)",
        ),
    )
    stop_budget: float = attrs.field(
        default=math.inf,
        converter=functools.partial(check_seconds, "stop_budget"),  # type: ignore[misc]
        metadata=_duration(
            help="seconds the orchestrator allows before SIGKILL (default: no limit)",
        ),
    )
    health_port: int | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(field_check(check_port)),
        metadata={
            COMMAND_LINE: CommandLine(
                "serve /livez, /readyz and /statusz on this port, 0 picks one "
                "(default: no health endpoint)",
                int,
                "a port number in 0..65535",
                check_speaks=False,
            )
        },
    )
    health_host: str | None = attrs.field(
        default=None,
        validator=_check_host,
        metadata={
            COMMAND_LINE: CommandLine(
                "address of the health endpoint (default: every interface)",
                str,
                "a host name or address",
            )
        },
    )
    health_max_connections: int = attrs.field(
        default=32,
        validator=field_check(check_count),
        metadata={
            COMMAND_LINE: CommandLine(
                "connections the health endpoint holds at once; at the limit "
                "one waiting for a request is closed, a slow head first "
                "(default: %(default)d)",
                int,
                "an int >= 1",
                check_speaks=False,
                metavar="N",
            )
        },
    )


DEFAULT_OPTIONS: Final = RunOptions()
"""Every option at its default: where `run`'s signature takes its defaults."""


def command_line_fields() -> tuple[attrs.Attribute[Any], ...]:
    """The fields of the options a command line may set, in `run`'s order."""
    return tuple(f for f in attrs.fields(RunOptions) if COMMAND_LINE in f.metadata)


@attrs.frozen(kw_only=True)
class RunSettings:
    """What one run does, settled once ``main`` is known."""

    options: RunOptions
    """The options as given (and checked)."""

    name: str
    """The program's name: ``options.name``, or ``main``'s."""

    takes_task_status: bool
    """Whether ``main`` takes ``task_status``."""

    times: StopTimes
    """The drain delay, grace and unwind budget in force: the options' own,
    unless they had to be shortened to fit the stop budget."""

    budget_warning: str | None
    """The warning to log at startup if they were shortened, else None."""


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


def settle(main: Callable[..., Awaitable[object]], options: RunOptions) -> RunSettings:
    """Check ``main`` against ``options`` and settle what the run does.

    Raises:
        TypeError: if ``main`` is not an async function.
        ValueError: for a ``startup_timeout`` given to a ``main`` that takes
            no ``task_status``.
    """
    _check_main(main)
    task_status = takes_task_status(main)
    if options.startup_timeout != math.inf and not task_status:
        raise ValueError(
            f"startup_timeout={options.startup_timeout:g} needs a main that takes "
            f"task_status and calls task_status.started() when it is ready"
        )
    times, budget_warning = fit_stop_budget(
        StopTimes(
            drain_delay=options.drain_delay,
            grace=options.grace,
            unwind_budget=options.unwind_budget,
            stop_budget=options.stop_budget,
        )
    )
    name = options.name
    if name is None:
        name = getattr(main, "__name__", "main")
    return RunSettings(
        options=options,
        name=str(name),
        takes_task_status=task_status,
        times=times,
        budget_warning=budget_warning,
    )
