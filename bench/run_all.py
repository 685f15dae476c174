"""Run every benchmark of trio_graceful and write the results.

    python bench/run_all.py              # the full suite; takes minutes
    python bench/run_all.py --quick      # seconds; checks that it all works
    python bench/run_all.py --only spawn,stop_fanout --output-dir /tmp/bench
    python bench/run_all.py --render bench/results/latest.json

A complete full run writes ``bench/results/latest.json`` (every figure, the
machine and the versions), ``latest.md`` (the report as Markdown) and
``latest.rst`` (the same for the documentation, which includes it). Quick
and partial runs print the report and write files only with --output-dir,
so that they never replace the full results. ``--render`` makes the two
reports again from a results file, measuring nothing.

The WebSocket benchmarks (bench_websocket_drain.py, bench_websocket_throughput.py)
and the ASGI ones (bench_asgi_drain.py, bench_asgi_throughput.py) start the
servers they compare as processes of their own, and need the ``bench``
extra: ``websockets``, ``trio-websocket``, Hypercorn, Starlette and uvicorn.
``--only asgi_drain,asgi_throughput --output-dir bench/results/asgi`` makes
the ASGI results the documentation includes. The benchmark of several worker
processes (bench_workers_reload.py) compares the servers this interpreter
has (trio_graceful, uvicorn, Hypercorn); run it alone with
``--peers-python`` for Gunicorn and Granian too, as the documentation's
table is made.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import inspect
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import _cli
import _common
import _render

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
SCHEMA = 1

# Name in the results file: the script that measures it.
BENCHMARKS = {
    "spawn": "bench_spawn",
    "cancel_latency": "bench_cancel_latency",
    "hard_cancel": "bench_hard_cancel",
    "stop_fanout": "bench_stop_fanout",
    "nested_shutdown": "bench_nested_shutdown",
    "websocket_drain": "bench_websocket_drain",
    "websocket_throughput": "bench_websocket_throughput",
    "instructions": "bench_instructions",
    "asgi_drain": "bench_asgi_drain",
    "asgi_throughput": "bench_asgi_throughput",
    "workers_reload": "bench_workers_reload",
}


def load(key: str) -> ModuleType:
    """Import a benchmark script."""
    return importlib.import_module(BENCHMARKS[key])


def run_benchmark(benchmark: ModuleType, *, quick: bool, gc_enabled: bool) -> Any:
    # The WebSocket drain measures other processes: --no-gc does not reach
    # them, and its script takes no such option.
    accepted = inspect.signature(benchmark.run).parameters
    options = {"quick": quick, "gc_enabled": gc_enabled}
    return benchmark.run(**{k: v for k, v in options.items() if k in accepted})


def measure(keys: list[str], *, quick: bool, gc_enabled: bool) -> dict[str, Any]:
    started = time.monotonic()
    results: dict[str, Any] = {
        "schema": SCHEMA,
        "started": datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%S UTC"
        ),
        "settings": {
            "mode": "quick" if quick else "full",
            "gc_enabled": gc_enabled,
            "benchmarks": keys,
        },
        "machine": _common.machine(),
        "load_average": {"start": _common.load_average()},
        "benchmarks": {},
    }
    for number, key in enumerate(keys, 1):
        benchmark = load(key)
        print(f"[{number}/{len(keys)}] {key} ...", file=sys.stderr, flush=True)
        began = time.monotonic()
        results["benchmarks"][key] = run_benchmark(
            benchmark, quick=quick, gc_enabled=gc_enabled
        )
        print(
            f"[{number}/{len(keys)}] {key}: {time.monotonic() - began:.1f} s",
            file=sys.stderr,
        )
    results["load_average"]["end"] = _common.load_average()
    results["duration_s"] = time.monotonic() - started
    return results


def report(
    results: dict[str, Any],
) -> tuple[list[_common.Table], list[_common.Goal]]:
    """Every table and goal of a results file, in the order of the suite."""
    tables: list[_common.Table] = []
    goals: list[_common.Goal] = []
    for key, result in results["benchmarks"].items():
        benchmark = load(key)
        tables.extend(benchmark.tables(result))
        goals.extend(benchmark.goals(result))
    return tables, goals


def write(results: dict[str, Any], directory: Path) -> None:
    _, goals = report(results)
    results = {**results, "goals": [dataclasses.asdict(goal) for goal in goals]}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "latest.json").write_text(json.dumps(results, indent=1) + "\n")
    render(directory / "latest.json")


def render(path: Path) -> str:
    """Write latest.md and latest.rst next to a results file; return the Markdown."""
    results = json.loads(path.read_text())
    tables, goals = report(results)
    markdown = _render.markdown_report(results, tables, goals)
    path.with_suffix(".md").write_text(markdown)
    path.with_suffix(".rst").write_text(_render.rst_report(results, tables, goals))
    return markdown


def main() -> None:
    parser = _cli.argument_parser(__doc__)
    parser.add_argument(
        "--only",
        metavar="NAMES",
        help="comma-separated benchmarks to run, of: " + ", ".join(BENCHMARKS),
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        help="where to write latest.json, latest.md and latest.rst "
        f"(default for a complete full run: {RESULTS.relative_to(BENCH.parent)})",
    )
    parser.add_argument(
        "--render",
        type=Path,
        metavar="RESULTS_JSON",
        help="measure nothing: write the .md and .rst reports of this results file",
    )
    args = parser.parse_args()
    if args.render is not None:
        print(render(args.render))
        return
    keys = list(BENCHMARKS)
    if args.only is not None:
        keys = [key.strip() for key in args.only.split(",") if key.strip()]
        unknown = [key for key in keys if key not in BENCHMARKS]
        if unknown:
            parser.error(
                f"--only: no benchmark named {', '.join(map(repr, unknown))}; "
                f"choose from {', '.join(BENCHMARKS)}"
            )
    results = measure(keys, quick=args.quick, gc_enabled=not args.no_gc)
    directory = args.output_dir
    if directory is None and not args.quick and keys == list(BENCHMARKS):
        directory = RESULTS
    if directory is None:
        tables, goals = report(results)
        print(_render.markdown_report(results, tables, goals))
        return
    write(results, directory)
    print((directory / "latest.md").read_text())
    print(f"Wrote {directory / 'latest.json'}, .md and .rst", file=sys.stderr)


if __name__ == "__main__":
    main()
