"""What importing costs: fresh processes, against ``import trio`` in the same run.

Each variant is a fresh interpreter that imports something and exits:
``import trio``, ``import trio_graceful``, ``import trio_graceful.jobs``,
and the jobs example's ``status`` and ``submit`` commands on a SQLite store
(which import the jobs package, parse their arguments and do their store
work). The variants are interleaved, and each one's cost over ``import
trio`` is the median of its differences with the ``import trio`` of the same
repetition; so is the time of the process itself. The goals are judged on
CPU time (user and system time of the process), which a busy machine
disturbs less than wall time; both are shown.

    python bench/bench_import.py                  # 20 repetitions
    python bench/bench_import.py --repetitions 50 --json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common
import _render

TITLE = "Importing: fresh processes"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "jobs_service.py"
REPETITIONS = 20
QUICK_REPETITIONS = 3

# Each variant: the Python code it runs (None: a command of the jobs
# example), and its goal over ``import trio`` in milliseconds (None: none).
# The package loads a name's modules when it is first read: the "first use"
# rows show what the core and the runner cost then.
VARIANTS: dict[str, tuple[str | None, float | None]] = {
    "import trio": ("import trio", None),
    "import trio_graceful": ("import trio_graceful", 30.0),
    "import trio_graceful.jobs": ("import trio_graceful.jobs", 40.0),
    "first use of open_bundle": (
        "import trio_graceful; trio_graceful.open_bundle",
        None,
    ),
    "first use of run": ("import trio_graceful; trio_graceful.run", None),
    "jobs_service.py status": (None, 80.0),
    "jobs_service.py submit": (None, 80.0),
}


def command(variant: str, store: str) -> list[str]:
    """The command line of one variant; ``store`` is the example's store URL."""
    code = VARIANTS[variant][0]
    if code is not None:
        return [sys.executable, "-c", code]
    action = variant.removeprefix("jobs_service.py ")
    extra = ["steps", "--steps", "1"] if action == "submit" else []
    return [sys.executable, str(EXAMPLE), "--store", store, action, *extra]


def sample(argv: list[str], cwd: str) -> tuple[float, float]:
    """Run ``argv`` once; return its (wall, CPU) seconds.

    Raises:
        RuntimeError: if the process fails.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{argv} failed ({done.returncode}):\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def run(*, repetitions: int) -> dict[str, Any]:
    """Measure every variant ``repetitions`` times, interleaved; see the docstring.

    Raises:
        ValueError: if ``repetitions`` is below 1.
    """
    if repetitions < 1:
        raise ValueError(f"repetitions must be >= 1, not {repetitions}")
    with tempfile.TemporaryDirectory() as directory:
        store = f"sqlite:///{os.path.join(directory, 'jobs.db')}"
        commands = {variant: command(variant, store) for variant in VARIANTS}
        _common.warm_up(list(VARIANTS), lambda v: sample(commands[v], directory))
        samples = _common.interleave(
            list(VARIANTS), repetitions, lambda v: sample(commands[v], directory)
        )
    reference = samples["import trio"]
    variants: dict[str, Any] = {}
    for variant, measured in samples.items():
        entry: dict[str, Any] = {"goal_over_trio_ms": VARIANTS[variant][1]}
        for index, clock in enumerate(("wall", "cpu")):
            own = [pair[index] for pair in measured]
            over = [
                pair[index] - base[index]
                for pair, base in zip(measured, reference, strict=True)
            ]
            entry[f"{clock}_s"] = _common.summarize(own)
            entry[f"{clock}_over_trio_s"] = statistics.median(over)
        variants[variant] = entry
    return {
        "repetitions": repetitions,
        "python": sys.version.split()[0],
        "variants": variants,
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:+.1f} ms"


def tables(result: dict[str, Any]) -> list[_common.Table]:
    rows = [
        [
            variant,
            _common.fmt_seconds(entry["cpu_s"]["median"]),
            _ms(entry["cpu_over_trio_s"]),
            _common.fmt_seconds(entry["wall_s"]["median"]),
            _ms(entry["wall_over_trio_s"]),
        ]
        for variant, entry in result["variants"].items()
    ]
    notes = [
        f"Medians of {_common.plural(result['repetitions'], 'repetition')} on "
        f"Python {result['python']}; the differences are paired with the "
        f"'import trio' of the same repetition.",
    ]
    columns = ["process", "CPU", "CPU over trio", "wall", "wall over trio"]
    return [_common.Table(TITLE, columns, rows, notes=notes)]


def goals(result: dict[str, Any]) -> list[_common.Goal]:
    judged = []
    for variant, entry in result["variants"].items():
        target = entry["goal_over_trio_ms"]
        if target is None:
            continue
        over = entry["cpu_over_trio_s"]
        judged.append(
            _common.Goal(
                item=f"{variant}: CPU time over 'import trio'",
                target=f"<= {target:g} ms",
                measured=_ms(over),
                met=over * 1e3 <= target,
            )
        )
    return judged


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--repetitions",
        type=int,
        default=None,
        help=f"processes per variant (default {REPETITIONS})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_REPETITIONS} repetitions: checks that the script works; "
        f"the numbers mean little",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the results as JSON too"
    )
    args = parser.parse_args(argv)
    repetitions = args.repetitions
    if repetitions is None:
        repetitions = QUICK_REPETITIONS if args.quick else REPETITIONS
    try:
        result = run(repetitions=repetitions)
    except ValueError as exc:
        parser.error(str(exc))
    for table in [*tables(result), _render.goals_table(goals(result))]:
        print(_render.markdown_table(table))
    if args.json:
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
