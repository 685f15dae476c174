"""STOP fan-out and drain: N inboxes stopped by one ``shutdown()``.

N children each wait for their next message in an inbox of one bundle
(``async for message in inbox``). Once all of them are waiting, the parent
calls ``await bundle.shutdown(grace)``: STOP goes to every inbox, every child
leaves its loop and returns, and ``shutdown()`` returns. Measured from the
call to its return (total), and from the call to the first child leaving
its loop (fan-out). For comparison, the same drain written by hand on Trio:
N memory channels, the parent closes every sender (the children see
end-of-channel) and leaves the nursery block.

The question is whether the cost per child stays flat from 1,000 to
100,000 children. Each sample is a fresh ``trio.run``; the variants are
interleaved.

Run ``python bench/bench_stop_fanout.py [--quick]`` for this benchmark
alone, or ``python bench/run_all.py`` for all of them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import _cli
import _common
import trio
import trio.testing

import trio_graceful

TITLE = "4. STOP fan-out and drain: N inboxes stopped by one shutdown()"

FULL = {"sizes": (1_000, 10_000, 100_000)}
QUICK = {"sizes": (100, 400)}

GRACE = 60.0  # never reached: every child ends at STOP
GOAL_GROWTH = 1.3

# Seconds from the start of the shutdown to the first child out, then the
# shutdown's wall time and CPU time.
Drain = tuple[float, float, float]


def repetitions_for(children: int, *, quick: bool) -> int:
    if quick:
        return 3
    return 15 if children <= 2_000 else 9 if children <= 20_000 else 5


async def drain(inbox: Any, left: list[float]) -> None:
    async for _ in inbox:
        pass
    left.append(time.perf_counter())


async def bundle_shutdown(children: int, gc_enabled: bool) -> Drain:
    left: list[float] = []
    async with trio_graceful.open_bundle() as bundle:
        senders = []
        for _ in range(children):
            sender, inbox = bundle.open_inbox()
            senders.append(sender)
            bundle.start_soon(drain, inbox, left)
        await trio.testing.wait_all_tasks_blocked()
        with _common.Stopwatch(gc_enabled=gc_enabled) as stopwatch:
            await bundle.shutdown(GRACE)
    return min(left) - stopwatch.started_at, stopwatch.elapsed, stopwatch.cpu


async def channels_closed(children: int, gc_enabled: bool) -> Drain:
    left: list[float] = []
    stopwatch = _common.Stopwatch(gc_enabled=gc_enabled)
    try:
        async with trio.open_nursery() as nursery:
            senders = []
            for _ in range(children):
                sender, receiver = trio.open_memory_channel[object](0)
                senders.append(sender)
                nursery.start_soon(drain, receiver, left)
            await trio.testing.wait_all_tasks_blocked()
            stopwatch.start()
            for sender in senders:
                sender.close()
    finally:
        stopwatch.stop()
    return min(left) - stopwatch.started_at, stopwatch.elapsed, stopwatch.cpu


VARIANTS: dict[str, tuple[str, Callable[[int, bool], Any]]] = {
    "bundle": ("STOP to N inboxes: await bundle.shutdown(grace)", bundle_shutdown),
    "trio": ("by hand: close N memory channels, leave the nursery", channels_closed),
}


def run(*, quick: bool = False, gc_enabled: bool = True) -> dict[str, Any]:
    """Run the benchmark; return its results as plain data (see `tables`)."""
    params = QUICK if quick else FULL
    names = list(VARIANTS)
    for name in names:  # imports and lazy set-up, unmeasured
        trio.run(VARIANTS[name][1], 10, True)
    rows = []
    for children in params["sizes"]:
        samples = _common.interleave(
            names,
            repetitions_for(children, quick=quick),
            lambda name, n=children: trio.run(VARIANTS[name][1], n, gc_enabled),
        )
        wall = {name: [sample[1] for sample in samples[name]] for name in names}
        cpu = {name: [sample[2] for sample in samples[name]] for name in names}
        rows.append(
            {
                "children": children,
                "repetitions": len(cpu["bundle"]),
                "cpu_s": {name: _common.summarize(cpu[name]) for name in names},
                "wall_s": {name: _common.summarize(wall[name]) for name in names},
                "first_out_s": {
                    name: _common.summarize([sample[0] for sample in samples[name]])
                    for name in names
                },
                "cpu_ratio": {
                    name: _common.paired_ratio(cpu[name], cpu["trio"]) for name in names
                },
                "wall_ratio": {
                    name: _common.paired_ratio(wall[name], wall["trio"])
                    for name in names
                },
            }
        )
    return {
        "title": TITLE,
        "variants": {name: label for name, (label, _) in VARIANTS.items()},
        "rows": rows,
        "growth": growth(rows, names, "cpu_s"),
        "wall_growth": growth(rows, names, "wall_s"),
    }


def growth(rows: list[dict[str, Any]], names: list[str], key: str) -> dict[str, float]:
    """Per-child cost at the largest size over the smallest, for each variant."""
    return {
        name: _common.growth(
            {
                row["children"]: row[key][name]["median"] / row["children"]
                for row in rows
            }
        )
        for name in names
    }


def tables(result: dict[str, Any]) -> list[_common.Table]:
    rows = []
    for row in result["rows"]:
        n = row["children"]
        for name in result["variants"]:
            cpu = row["cpu_s"][name]["median"]
            rows.append(
                [
                    f"{n:,}",
                    name,
                    _common.fmt_seconds(cpu),
                    _common.fmt_seconds(cpu / n),
                    _common.fmt_seconds(row["wall_s"][name]["median"] / n),
                    _common.fmt_seconds(row["first_out_s"][name]["median"]),
                    _common.fmt_ratio(row["cpu_ratio"][name]),
                    _common.fmt_ratio(row["wall_ratio"][name]),
                ]
            )
    cpu_growth, wall_growth = (
        "; ".join(f"{name} {_common.fmt_ratio(value)}" for name, value in g.items())
        for g in (result["growth"], result["wall_growth"])
    )
    return [
        _common.Table(
            title=TITLE,
            columns=[
                "children",
                "variant",
                "CPU time",
                "CPU per child",
                "wall per child",
                "first child out",
                "CPU vs trio",
                "wall vs trio",
            ],
            rows=rows,
            notes=[
                _common.variants_note(result["variants"]),
                "Medians over the repetitions, from the start of the shutdown until "
                "every child has ended; first child out (wall time): until the "
                "first child left its loop.",
                "Linearity, per-child cost at the largest size over the smallest: "
                f"CPU time {cpu_growth}; wall time {wall_growth}.",
            ],
        )
    ]


def goals(result: dict[str, Any]) -> list[_common.Goal]:
    """Item 4's goal: the cost per child grows by at most 1.3 times."""
    sizes = [row["children"] for row in result["rows"]]
    growth = result["growth"]["bundle"]
    return [
        _common.Goal(
            item=f"4. STOP fan-out, per-child cost at {max(sizes):,} "
            f"over {min(sizes):,}",
            target=f"≤ {_common.fmt_ratio(GOAL_GROWTH)}",
            measured=f"{_common.fmt_ratio(growth)} "
            f"(trio: {_common.fmt_ratio(result['growth']['trio'])})",
            met=growth <= GOAL_GROWTH,
        )
    ]


if __name__ == "__main__":
    _cli.run_one(sys.modules[__name__], _cli.argument_parser(__doc__).parse_args())
