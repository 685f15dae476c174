"""The command line shared by run_all.py and each benchmark script."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import _render


def argument_parser(
    doc: str | None, *, gc_option: bool = True
) -> argparse.ArgumentParser:
    """A parser with --quick, and --no-gc unless the script cannot honour it."""
    parser = argparse.ArgumentParser(
        description=(doc or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes and few repetitions: checks that the scripts work, "
        "in seconds; the numbers mean little",
    )
    if not gc_option:  # the script measures other processes
        return parser
    parser.add_argument(
        "--no-gc",
        action="store_true",
        help="turn the garbage collector off while measuring (it is on by "
        "default, as in a real program)",
    )
    return parser


def run_one(benchmark: ModuleType, args: argparse.Namespace) -> None:
    """Run one benchmark script and print its tables and goals in Markdown."""
    print_report(benchmark, benchmark.run(quick=args.quick, gc_enabled=not args.no_gc))


def print_report(benchmark: ModuleType, result: Any) -> None:
    """Print the tables and goals of a benchmark's results in Markdown."""
    for table in benchmark.tables(result):
        print(_render.markdown_table(table))
    print(_render.markdown_table(_render.goals_table(benchmark.goals(result))))


def print_results(module_name: str, result: Any) -> None:
    """Print a script's report in Markdown, then its results as JSON."""
    print_report(sys.modules[module_name], result)
    print(json.dumps(result, indent=1))


def throughput_main(module_name: str, argv: list[str] | None) -> None:
    """The command line of a throughput script: its options, a run, the report.

    The script's module has ``FULL`` (its default sizes) and
    ``run(quick, seconds, repetitions, connections, instructions)``.
    """
    module = sys.modules[module_name]
    full = module.FULL
    parser = argument_parser(module.__doc__, gc_option=False)
    parser.add_argument(
        "--seconds",
        type=float,
        help=f"seconds measured per run (default {full['seconds']:g})",
    )
    parser.add_argument(
        "--repetitions",
        type=int,
        help=f"runs per server (default {full['repetitions']:g})",
    )
    parser.add_argument(
        "--connections",
        type=int,
        help=f"client connections (default {full['connections']:g})",
    )
    parser.add_argument(
        "--no-instructions",
        dest="instructions",
        action="store_false",
        default=None,
        help="do not count instructions with callgrind (minutes)",
    )
    args = parser.parse_args(argv)
    result = module.run(
        quick=args.quick,
        seconds=args.seconds,
        repetitions=args.repetitions,
        connections=args.connections,
        instructions=args.instructions,
    )
    print_results(module_name, result)


def throughput_sizes(
    settings: Mapping[str, float],
    seconds: float | None,
    repetitions: int | None,
    connections: int | None,
) -> tuple[float, int, int]:
    """The sizes of a throughput run: those given, else the settings'.

    Raises:
        ValueError: if one is out of range.
    """
    seconds = settings["seconds"] if seconds is None else seconds
    repetitions = int(settings["repetitions"] if repetitions is None else repetitions)
    connections = int(settings["connections"] if connections is None else connections)
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, not {seconds}")
    if repetitions < 1:
        raise ValueError(f"repetitions must be >= 1, not {repetitions}")
    if connections < 1:
        raise ValueError(f"connections must be >= 1, not {connections}")
    return seconds, repetitions, connections
