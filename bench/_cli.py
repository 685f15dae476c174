"""The command line shared by run_all.py and each benchmark script."""

from __future__ import annotations

import argparse
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
