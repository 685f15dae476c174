"""Latency of ``cancel(grace)``: from the last child's exit to ``cancel()`` returning.

The children end by themselves, well within the grace: each takes two
checkpoints (so that the parent is already waiting) and returns, noting the
time (`time.perf_counter`) as its very last step. The parent notes the time
as soon as it resumes. The same is measured for the ends of a nursery block,
an anyio task group block and a bundle block (leaving ``async with``, which
waits for the children), so that the scheduler's own share is visible.

Many samples, interleaved, all in one ``trio.run`` on the real clock;
median and 99th percentile.

Run ``python bench/bench_cancel_latency.py [--quick]`` for this benchmark
alone, or ``python bench/run_all.py`` for all of them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import _cli
import _common
import trio

import trio_graceful

TITLE = "2. cancel(grace) latency: last child's exit to cancel() returning"

FULL = {"children": (1, 100), "samples": 1_000}
QUICK = {"children": (1, 10), "samples": 20}

GRACE = 60.0  # never reached: the children end by themselves
GOAL_SECONDS = 0.2e-3


async def child(exits: list[float]) -> None:
    await trio.lowlevel.checkpoint()
    await trio.lowlevel.checkpoint()
    exits.append(time.perf_counter())


async def bundle_cancel(children: int) -> float:
    exits: list[float] = []
    async with trio_graceful.open_bundle() as bundle:
        for _ in range(children):
            bundle.start_soon(child, exits)
        await bundle.cancel(GRACE)
        returned = time.perf_counter()
    return returned - max(exits)


async def bundle_exit(children: int) -> float:
    exits: list[float] = []
    async with trio_graceful.open_bundle() as bundle:
        for _ in range(children):
            bundle.start_soon(child, exits)
    return time.perf_counter() - max(exits)


async def nursery_exit(children: int) -> float:
    exits: list[float] = []
    async with trio.open_nursery() as nursery:
        for _ in range(children):
            nursery.start_soon(child, exits)
    return time.perf_counter() - max(exits)


async def task_group_exit(children: int) -> float:
    assert _common.anyio is not None
    exits: list[float] = []
    async with _common.anyio.create_task_group() as task_group:
        for _ in range(children):
            task_group.start_soon(child, exits)
    return time.perf_counter() - max(exits)


def variants() -> dict[str, tuple[str, Callable[[int], Awaitable[float]]]]:
    """What is measured, by variant name: a label and the sampling function."""
    found: dict[str, tuple[str, Callable[[int], Awaitable[float]]]] = {
        "bundle.cancel": ("await bundle.cancel(grace) returns", bundle_cancel),
        "bundle exit": ("async with open_bundle() block exits", bundle_exit),
        "trio exit": ("async with open_nursery() block exits", nursery_exit),
    }
    if _common.anyio is not None:
        found["anyio exit"] = (
            "async with create_task_group() block exits",
            task_group_exit,
        )
    return found


def run(*, quick: bool = False, gc_enabled: bool = True) -> dict[str, Any]:
    """Run the benchmark; return its results as plain data (see `tables`)."""
    params = QUICK if quick else FULL
    found = variants()

    async def main() -> list[dict[str, Any]]:
        rows = []
        for name in found:  # imports and lazy set-up, unmeasured
            await found[name][1](1)
        with _common.collector(enabled=gc_enabled):
            for children in params["children"]:
                samples: dict[str, list[float]] = {name: [] for name in found}
                for _, name in _common.schedule(list(found), params["samples"]):
                    samples[name].append(await found[name][1](children))
                rows.append(
                    {
                        "children": children,
                        "latency_s": {
                            name: _common.summarize(values)
                            for name, values in samples.items()
                        },
                    }
                )
        return rows

    return {
        "title": TITLE,
        "variants": {name: label for name, (label, _) in found.items()},
        "missing": [] if _common.anyio is not None else [_common.ANYIO_MISSING],
        "samples": params["samples"],
        "grace_s": GRACE,
        "rows": trio.run(main),
    }


def tables(result: dict[str, Any]) -> list[_common.Table]:
    rows = [
        [
            f"{row['children']:,}",
            name,
            _common.fmt_seconds(latency["median"]),
            _common.fmt_seconds(latency["p99"]),
            _common.fmt_seconds(latency["max"]),
        ]
        for row in result["rows"]
        for name, latency in row["latency_s"].items()
    ]
    return [
        _common.Table(
            title=TITLE,
            columns=["children", "what returns", "median", "p99", "max"],
            rows=rows,
            notes=[
                f"{result['samples']:,} samples per line, real clock. From the "
                "moment the last child ends to the moment the waiting task "
                "resumes: "
                + "; ".join(
                    f"{name} = {label}" for name, label in result["variants"].items()
                )
                + ".",
                *result["missing"],
            ],
        )
    ]


def goals(result: dict[str, Any]) -> list[_common.Goal]:
    """Item 2's goal: cancel() returns within 0.2 ms of the last child's end."""
    return [
        _common.Goal(
            item=f"2. cancel() latency, {_common.plural(row['children'], 'child')}, "
            "median",
            target=f"< {_common.fmt_seconds(GOAL_SECONDS)}",
            measured=_common.fmt_seconds(row["latency_s"]["bundle.cancel"]["median"]),
            met=row["latency_s"]["bundle.cancel"]["median"] < GOAL_SECONDS,
        )
        for row in result["rows"]
    ]


if __name__ == "__main__":
    _cli.run_one(sys.modules[__name__], _cli.argument_parser(__doc__).parse_args())
