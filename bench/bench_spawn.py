"""Spawn-and-exit cost of trivial children: a bundle, a nursery, an anyio task group.

Each sample is a fresh ``trio.run`` that opens one container, starts N
children that return at once, and leaves the block (which waits for them).
It is timed from before the ``async with`` to after it, and, in a separate
pass, its memory is measured two ways:

* the peak of what Python allocated, counted by `tracemalloc` (exact and
  repeatable; the allocator's own overhead is not in it);
* the growth of the peak resident set size, in a fresh process per sample
  (what the machine paid; coarse, Linux only).

The same is done for trees of nested containers (every inner node opens its
own container), where the fixed cost of each container shows.

Run ``python bench/bench_spawn.py [--quick]`` for this benchmark alone, or
``python bench/run_all.py`` for all of them.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import subprocess
import sys
import tracemalloc
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import _cli
import _common
import trio

import trio_graceful

TITLE = "1. Spawn and exit of trivial children"

FULL = {
    "sizes": (1_000, 10_000, 100_000),
    "trees": ((10, 3), (10, 4), (10, 5), (2, 10), (2, 13), (2, 16)),
    "memory_repetitions": 3,
    "rss_repetitions": 3,
}
QUICK = {
    "sizes": (200,),
    "trees": ((3, 3),),
    "memory_repetitions": 1,
    "rss_repetitions": 1,
}


def repetitions_for(children: int, *, quick: bool) -> int:
    """More repetitions for the short samples, where noise weighs more."""
    if quick:
        return 3
    return 21 if children <= 2_000 else 11 if children <= 20_000 else 7


def containers() -> dict[str, Callable[[], AbstractAsyncContextManager[Any]]]:
    """The containers compared, by variant name: anyio's only if installed."""
    found: dict[str, Callable[[], AbstractAsyncContextManager[Any]]] = {
        "trio": trio.open_nursery,
        "bundle": trio_graceful.open_bundle,
    }
    if _common.anyio is not None:
        found["anyio"] = _common.anyio.create_task_group
    return found


async def trivial() -> None:
    pass


async def spawn_flat(
    open_container: Callable[[], AbstractAsyncContextManager[Any]], children: int
) -> None:
    async with open_container() as container:
        for _ in range(children):
            container.start_soon(trivial)


async def spawn_tree(
    open_container: Callable[[], AbstractAsyncContextManager[Any]],
    fanout: int,
    depth: int,
) -> None:
    async with open_container() as container:
        for _ in range(fanout):
            if depth == 1:
                container.start_soon(trivial)
            else:
                container.start_soon(spawn_tree, open_container, fanout, depth - 1)


def time_once(
    work: Callable[[], Awaitable[object]], *, gc_enabled: bool
) -> tuple[float, float]:
    """Run ``work`` in a fresh ``trio.run``; return its (wall, CPU) seconds."""

    async def main() -> tuple[float, float]:
        with _common.Stopwatch(gc_enabled=gc_enabled) as stopwatch:
            await work()
        return stopwatch.elapsed, stopwatch.cpu

    return trio.run(main)


def traced_peak_once(work: Callable[[], Awaitable[object]]) -> int:
    async def main() -> int:
        with _common.TracedPeak() as peak:
            await work()
        return peak.bytes

    tracemalloc.start()
    try:
        return trio.run(main)
    finally:
        tracemalloc.stop()


def rss_peak_in_subprocess(variant: str, children: int, *, gc_enabled: bool) -> int:
    """Run one flat sample in a fresh interpreter; return its peak RSS growth."""
    command = [sys.executable, __file__, "--rss-probe", variant, str(children)]
    if not gc_enabled:
        command.append("--no-gc")
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return int(done.stdout)


def rss_probe(variant: str, children: int, *, gc_enabled: bool) -> int:
    """The body of the fresh interpreter started by `rss_peak_in_subprocess`."""
    open_container = containers()[variant]

    async def main() -> int:
        await spawn_flat(open_container, 100)  # imports and lazy set-up
        with _common.collector(enabled=gc_enabled), _common.RssPeak() as peak:
            await spawn_flat(open_container, children)
        return peak.kib

    return trio.run(main)


Workload = Callable[[Callable[[], AbstractAsyncContextManager[Any]]], Awaitable[object]]


def measure(
    workload: Workload, *, repetitions: int, memory_repetitions: int, gc_enabled: bool
) -> dict[str, Any]:
    """Time and traced memory of ``workload`` run in each variant's container."""
    found = containers()
    variants = list(found)
    times = _common.interleave(
        variants,
        repetitions,
        lambda v: time_once(
            functools.partial(workload, found[v]), gc_enabled=gc_enabled
        ),
    )
    peaks = _common.interleave(
        variants,
        memory_repetitions,
        lambda v: traced_peak_once(functools.partial(workload, found[v])),
    )
    traced = {v: statistics.median(peaks[v]) for v in variants}
    wall = {v: [w for w, _ in times[v]] for v in variants}
    cpu = {v: [c for _, c in times[v]] for v in variants}
    return {
        "repetitions": repetitions,
        "cpu_s": {v: _common.summarize(cpu[v]) for v in variants},
        "cpu_ratio": {v: _common.paired_ratio(cpu[v], cpu["trio"]) for v in variants},
        "wall_s": {v: _common.summarize(wall[v]) for v in variants},
        "wall_ratio": {
            v: _common.paired_ratio(wall[v], wall["trio"]) for v in variants
        },
        "traced_peak_bytes": traced,
        "traced_ratio": {v: traced[v] / traced["trio"] for v in variants},
    }


def measure_rss(children: int, *, repetitions: int, gc_enabled: bool) -> dict[str, Any]:
    variants = list(containers())
    peaks = _common.interleave(
        variants,
        repetitions,
        lambda v: rss_peak_in_subprocess(v, children, gc_enabled=gc_enabled),
    )
    rss = {v: statistics.median(peaks[v]) for v in variants}
    return {
        "rss_peak_kib": rss,
        "rss_ratio": {
            v: _common.paired_ratio(peaks[v], peaks["trio"]) for v in variants
        },
    }


def run(*, quick: bool = False, gc_enabled: bool = True) -> dict[str, Any]:
    """Run the benchmark; return its results as plain data (see `tables`)."""
    params = QUICK if quick else FULL
    found = containers()
    # Imports, caches and lazy set-up of every variant, unmeasured.
    _common.warm_up(
        list(found),
        lambda v: time_once(
            functools.partial(spawn_flat, found[v], 100), gc_enabled=True
        ),
    )
    flat = []
    for children in params["sizes"]:
        row: dict[str, Any] = {"children": children}
        row.update(
            measure(
                functools.partial(spawn_flat, children=children),
                repetitions=repetitions_for(children, quick=quick),
                memory_repetitions=params["memory_repetitions"],
                gc_enabled=gc_enabled,
            )
        )
        if _common.rss_supported():
            row.update(
                measure_rss(
                    children,
                    repetitions=params["rss_repetitions"],
                    gc_enabled=gc_enabled,
                )
            )
        flat.append(row)
    trees = []
    for fanout, depth in params["trees"]:
        leaves = fanout**depth
        row = {
            "fanout": fanout,
            "depth": depth,
            "leaves": leaves,
            "containers": sum(fanout**level for level in range(depth)),
        }
        row.update(
            measure(
                functools.partial(spawn_tree, fanout=fanout, depth=depth),
                repetitions=repetitions_for(leaves, quick=quick),
                memory_repetitions=params["memory_repetitions"],
                gc_enabled=gc_enabled,
            )
        )
        trees.append(row)
    return {
        "title": TITLE,
        "variants": {v: _common.LABELS[v] for v in found},
        "missing": [] if "anyio" in found else [_common.ANYIO_MISSING],
        "rss": None if _common.rss_supported() else "not measured: Linux only",
        "flat": flat,
        "trees": trees,
    }


GOAL_RATIO = 1.05


def tables(result: dict[str, Any]) -> list[_common.Table]:
    """The results as tables, for the Markdown and reStructuredText reports."""
    rss_measured = result["rss"] is None
    flat_columns = [
        "children",
        "variant",
        "CPU time per child",
        "min - max",
        "CPU vs trio",
        "wall vs trio",
        "traced peak per child",
        "memory vs trio",
    ]
    if rss_measured:
        flat_columns += ["peak RSS growth", "RSS vs trio"]
    flat_rows = []
    for row in result["flat"]:
        n = row["children"]
        for v in result["variants"]:
            cpu = row["cpu_s"][v]
            spread = (
                f"{_common.fmt_seconds(cpu['min'] / n)} - "
                f"{_common.fmt_seconds(cpu['max'] / n)}"
            )
            cells = [
                f"{n:,}",
                v,
                _common.fmt_seconds(cpu["median"] / n),
                spread,
                _common.fmt_ratio(row["cpu_ratio"][v]),
                _common.fmt_ratio(row["wall_ratio"][v]),
                f"{row['traced_peak_bytes'][v] / n:,.0f} B",
                _common.fmt_ratio(row["traced_ratio"][v]),
            ]
            if rss_measured:
                cells += [
                    f"{row['rss_peak_kib'][v] / 1024:,.1f} MiB",
                    _common.fmt_ratio(row["rss_ratio"][v]),
                ]
            flat_rows.append(cells)
    tree_rows = []
    for row in result["trees"]:
        leaves = row["leaves"]
        for v in result["variants"]:
            tree_rows.append(
                [
                    f"{row['fanout']}^{row['depth']}",
                    f"{leaves:,}",
                    f"{row['containers']:,}",
                    v,
                    _common.fmt_seconds(row["cpu_s"][v]["median"] / leaves),
                    _common.fmt_ratio(row["cpu_ratio"][v]),
                    _common.fmt_ratio(row["wall_ratio"][v]),
                    f"{row['traced_peak_bytes'][v] / leaves:,.0f} B",
                    _common.fmt_ratio(row["traced_ratio"][v]),
                ]
            )
    return [
        _common.Table(
            title=f"{TITLE}: flat",
            columns=flat_columns,
            rows=flat_rows,
            notes=[
                _common.variants_note(result["variants"]),
                "CPU time: median over the repetitions of one open-spawn-exit "
                "cycle, divided by the number of children. 'vs trio': the median "
                "of the ratios taken within each repetition, in CPU time and in "
                "wall time.",
                "Traced peak: the most memory Python had allocated at once "
                "(tracemalloc), per child. Peak RSS growth: how far the resident "
                "set size rose, in a fresh process per sample.",
                *result["missing"],
            ],
        ),
        _common.Table(
            title=f"{TITLE}: trees of nested containers",
            columns=[
                "fan-out^depth",
                "leaves",
                "containers",
                "variant",
                "CPU time per leaf",
                "CPU vs trio",
                "wall vs trio",
                "traced peak per leaf",
                "memory vs trio",
            ],
            rows=tree_rows,
            notes=[
                "Every inner node opens its own container; the leaves return at once.",
                *result["missing"],
            ],
        ),
    ]


def goals(result: dict[str, Any]) -> list[_common.Goal]:
    """Item 1's goal: a bundle costs at most 1.05 times a nursery, time and memory."""
    rows = [(f"{row['children']:,} children", row) for row in result["flat"]]
    rows += [(f"tree {row['fanout']}^{row['depth']}", row) for row in result["trees"]]
    return [
        _common.Goal(
            item=f"1. {what}: CPU time, traced memory",
            target=f"≤ {GOAL_RATIO:.2f}x trio",
            measured=f"{_common.fmt_ratio(row['cpu_ratio']['bundle'])}, "
            f"{_common.fmt_ratio(row['traced_ratio']['bundle'])}",
            met=max(row["cpu_ratio"]["bundle"], row["traced_ratio"]["bundle"])
            <= GOAL_RATIO,
        )
        for what, row in rows
    ]


def main() -> None:
    parser = _cli.argument_parser(__doc__)
    # Used by rss_peak_in_subprocess() only.
    parser.add_argument("--rss-probe", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_probe is not None:
        variant, children = args.rss_probe
        print(rss_probe(variant, int(children), gc_enabled=not args.no_gc))
        return
    _cli.run_one(sys.modules[__name__], args)


if __name__ == "__main__":
    main()
