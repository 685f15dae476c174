"""The command-line options of `trio_graceful.run`: one call adds them, one reads them.

A service is tuned for its orchestrator from the outside: how long its grace
is, how long it goes on serving once withdrawn, how much time the
orchestrator allows in all, where its health endpoint listens.
`add_run_arguments` gives a program those options, each checked as `run`
checks its argument, and `run_arguments` hands what was parsed to `run`.
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable, Sequence
from typing import TypedDict

from .._children._admission import check_count
from .._core._util import check_port, check_seconds


class RunArguments(TypedDict):
    """The keyword arguments of `trio_graceful.run` that `add_run_arguments` adds."""

    grace: float
    unwind_budget: float
    drain_delay: float
    stop_budget: float
    health_port: int | None
    health_host: str | None
    health_max_connections: int


def _seconds(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be a number of seconds, not {text!r}"
            ) from None
        try:
            return check_seconds(name, value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _health_port(text: str) -> int:
    try:
        return check_port("health_port", int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"health_port must be a port number in 0..65535, not {text!r}"
        ) from None


def _count(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            return check_count(name, int(text))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be an integer >= 1, not {text!r}"
            ) from None

    return parse


def _refuse_host_without_port(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` refuse ``--health-host`` without ``--health-port``.

    argparse checks each option alone; this pair is checked once all are
    parsed, by the parser's own `parse_known_args` (which ``parse_args``
    and the intermixed variants call), so the error is a usage error.
    """
    parse_known_args = parser.parse_known_args

    @functools.wraps(parse_known_args)
    def parse_checked(
        args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = parse_known_args(args, namespace or argparse.Namespace())
        if (
            getattr(parsed, "health_host", None) is not None
            and getattr(parsed, "health_port", None) is None
        ):
            parser.error(
                "argument --health-host: needs --health-port "
                "(--health-port=0 picks a free port)"
            )
        return parsed, extras

    vars(parser)["parse_known_args"] = parse_checked


def add_run_arguments(
    parser: argparse.ArgumentParser,
    *,
    grace: float = 10.0,
    unwind_budget: float = 3.0,
) -> None:
    """Add the options of `trio_graceful.run` to ``parser``, in a group of their own.

    ``--grace`` and ``--unwind-budget`` (with the defaults given here),
    ``--drain-delay`` (default 0), ``--stop-budget`` (default: no limit),
    ``--health-port``, ``--health-host`` and ``--health-max-connections``
    (default: no health endpoint; every interface; 32 connections). A bad
    value is refused by the parser, naming the option and the value, and so
    is ``--health-host`` without ``--health-port``::

        parser = argparse.ArgumentParser()
        trio_graceful.add_run_arguments(parser, grace=30)
        args = parser.parse_args()
        sys.exit(trio_graceful.run(main, **trio_graceful.run_arguments(args)))

    Raises:
        TypeError: if ``parser`` is not an ``argparse.ArgumentParser``.
        ValueError: if ``grace`` or ``unwind_budget`` is not a valid number
            of seconds.
    """
    if not isinstance(parser, argparse.ArgumentParser):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"parser must be an ArgumentParser, not {parser!r}")
    grace = check_seconds("grace", grace)
    unwind_budget = check_seconds("unwind_budget", unwind_budget)
    group = parser.add_argument_group("shutdown and deployment")
    add = group.add_argument
    add(
        "--grace",
        type=_seconds("grace"),
        default=grace,
        help="seconds the graceful shutdown may take (default: %(default)g)",
    )
    add(
        "--unwind-budget",
        type=_seconds("unwind_budget"),
        default=unwind_budget,
        help="seconds a hard cancel may take to unwind before the emergency "
        "exit (default: %(default)g)",
    )
    add(
        "--drain-delay",
        type=_seconds("drain_delay"),
        default=0.0,
        help="seconds to go on serving, not ready, after the signal (default: 0)",
    )
    add(
        "--stop-budget",
        type=_seconds("stop_budget"),
        default=math.inf,
        help="seconds the orchestrator allows before SIGKILL (default: no limit)",
    )
    add(
        "--health-port",
        type=_health_port,
        default=None,
        help="serve /livez, /readyz and /statusz on this port (0 picks one)",
    )
    add(
        "--health-host",
        default=None,
        help="address of the health endpoint (default: every interface)",
    )
    add(
        "--health-max-connections",
        type=_count("health_max_connections"),
        default=32,
        metavar="N",
        help="connections the health endpoint holds at once; at the limit the "
        "oldest one waiting for a request is closed (default: %(default)d)",
    )
    _refuse_host_without_port(parser)


_NAMES = tuple(RunArguments.__annotations__)


def run_arguments(args: argparse.Namespace) -> RunArguments:
    """Return the options that `add_run_arguments` added, for `trio_graceful.run`.

    Raises:
        TypeError: if ``args`` is not an ``argparse.Namespace``.
        ValueError: if ``args`` was not parsed by a parser that
            `add_run_arguments` prepared.
    """
    if not isinstance(args, argparse.Namespace):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"args must be an argparse.Namespace, not {args!r}")
    missing = [name for name in _NAMES if not hasattr(args, name)]
    if missing:
        raise ValueError(
            f"args has no {', '.join(missing)}: parse them with a parser "
            f"given to add_run_arguments"
        )
    return RunArguments(
        grace=args.grace,
        unwind_budget=args.unwind_budget,
        drain_delay=args.drain_delay,
        stop_budget=args.stop_budget,
        health_port=args.health_port,
        health_host=args.health_host,
        health_max_connections=args.health_max_connections,
    )
