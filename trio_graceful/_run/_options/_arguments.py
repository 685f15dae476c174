"""The command-line options of `trio_graceful.run`: one call adds them, one reads them.

A service is tuned for its orchestrator from the outside: how long its grace
is, how long it goes on serving once withdrawn, how much time the
orchestrator allows in all, where its health endpoint listens.
`add_run_arguments` gives a program those options and `run_arguments` hands
what was parsed to `run`. Both are derived from ``_runoptions.RunOptions``:
the options are its fields that carry a `CommandLine`, their defaults are its
defaults, and each value is checked by the field's own check.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Sequence
from typing import Any, Final, TypedDict, cast

import attrs

from ._runoptions import COMMAND_LINE, DEFAULT_OPTIONS, CommandLine, command_line_fields


class RunArguments(TypedDict):
    """The keyword arguments of `trio_graceful.run` that `add_run_arguments` adds."""

    grace: float
    unwind_budget: float
    drain_delay: float
    stop_budget: float
    health_port: int | None
    health_host: str | None
    health_max_connections: int


# What each option is checked against: the defaults, with a health port, so
# that --health-host alone passes (its need of a port is checked when all
# options are parsed, by _refuse_host_without_port).
_ALONE: Final = attrs.evolve(DEFAULT_OPTIONS, health_port=0)


def _parse(field: attrs.Attribute[Any]) -> Callable[[str], object]:
    """The argparse ``type`` of ``field``'s option: its text, checked by the field."""
    line: CommandLine = field.metadata[COMMAND_LINE]
    name = field.name

    def parse(text: str) -> object:
        refusal = f"{name} must be {line.requirement}, not {text!r}"
        try:
            value = line.text_to(text)
        except ValueError:
            raise argparse.ArgumentTypeError(refusal) from None
        try:
            checked = attrs.evolve(_ALONE, **cast("dict[str, Any]", {name: value}))
        except (TypeError, ValueError) as exc:
            message = str(exc) if line.check_speaks else refusal
            raise argparse.ArgumentTypeError(message) from None
        return getattr(checked, name)

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
    grace: float = DEFAULT_OPTIONS.grace,
    unwind_budget: float = DEFAULT_OPTIONS.unwind_budget,
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
    defaults = attrs.evolve(DEFAULT_OPTIONS, grace=grace, unwind_budget=unwind_budget)
    group = parser.add_argument_group("shutdown and deployment")
    for field in command_line_fields():
        line: CommandLine = field.metadata[COMMAND_LINE]
        group.add_argument(
            "--" + field.name.replace("_", "-"),
            type=_parse(field),
            default=getattr(defaults, field.name),
            help=line.help,
            metavar=line.metavar,
        )
    _refuse_host_without_port(parser)


_NAMES: Final = tuple(field.name for field in command_line_fields())


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
    return cast("RunArguments", {name: getattr(args, name) for name in _NAMES})
