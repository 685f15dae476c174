"""Shutdown of nested trees: depth x fan-out, up to about 100,000 leaves.

Every inner node of the tree is a child that opens its own bundle, gives
each of its children an inbox, and waits in its own inbox. At STOP it shuts
its bundle down, passing STOP one level further, and returns when its
children have ended. The leaves wait in their inbox and return at STOP. Once
the whole tree is waiting, the root calls ``await bundle.shutdown(grace)``,
timed until it returns. For comparison, the same tree written by hand on
Trio: nested nurseries and memory channels, each node closing its
children's channels when its own is closed.

The question is whether the cost per leaf stays flat as the tree grows,
for a bushy shape (fan-out 10) and a deep one (fan-out 2). Each sample is a
fresh ``trio.run``; the variants are interleaved.

Run ``python bench/bench_nested_shutdown.py [--quick]`` for this benchmark
alone, or ``python bench/run_all.py`` for all of them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import _cli
import _common
import trio
import trio.testing

import trio_graceful

TITLE = "5. Shutdown of nested trees"

FULL = {"shapes": {10: (3, 4, 5), 2: (10, 13, 16)}}
QUICK = {"shapes": {3: (2, 4)}}

GRACE = 60.0  # never reached: every node ends at STOP
GOAL_GROWTH = 1.3


def repetitions_for(leaves: int, *, quick: bool) -> int:
    if quick:
        return 3
    return 15 if leaves <= 2_000 else 9 if leaves <= 20_000 else 5


# -- the tree on bundles and inboxes ------------------------------------------


async def bundle_leaf(inbox: trio_graceful.InboxReceiver[object]) -> None:
    async for _ in inbox:
        pass


async def bundle_node(
    inbox: trio_graceful.InboxReceiver[object], fanout: int, depth: int
) -> None:
    async with trio_graceful.open_bundle() as bundle:
        senders = start_bundle_children(bundle, fanout, depth)
        async for _ in inbox:
            pass
        await bundle.shutdown(GRACE)
        del senders


def start_bundle_children(
    bundle: trio_graceful.Bundle, fanout: int, depth: int
) -> list[trio_graceful.InboxSender[object]]:
    senders = []
    for _ in range(fanout):
        sender, inbox = bundle.open_inbox()
        senders.append(sender)
        if depth == 1:
            bundle.start_soon(bundle_leaf, inbox)
        else:
            bundle.start_soon(bundle_node, inbox, fanout, depth - 1)
    return senders


# The shutdown's wall time and CPU time, in seconds.
Timing = tuple[float, float]


async def bundle_tree(fanout: int, depth: int, gc_enabled: bool) -> Timing:
    async with trio_graceful.open_bundle() as root:
        senders = start_bundle_children(root, fanout, depth)
        await trio.testing.wait_all_tasks_blocked()
        with _common.Stopwatch(gc_enabled=gc_enabled) as stopwatch:
            await root.shutdown(GRACE)
        del senders
    return stopwatch.elapsed, stopwatch.cpu


# -- the same tree by hand on Trio --------------------------------------------


async def trio_leaf(receiver: trio.MemoryReceiveChannel[object]) -> None:
    async for _ in receiver:
        pass


async def trio_node(
    receiver: trio.MemoryReceiveChannel[object], fanout: int, depth: int
) -> None:
    async with trio.open_nursery() as nursery:
        senders = start_trio_children(nursery, fanout, depth)
        async for _ in receiver:
            pass
        for sender in senders:
            sender.close()


def start_trio_children(
    nursery: trio.Nursery, fanout: int, depth: int
) -> list[trio.MemorySendChannel[object]]:
    senders = []
    for _ in range(fanout):
        sender, receiver = trio.open_memory_channel[object](0)
        senders.append(sender)
        if depth == 1:
            nursery.start_soon(trio_leaf, receiver)
        else:
            nursery.start_soon(trio_node, receiver, fanout, depth - 1)
    return senders


async def trio_tree(fanout: int, depth: int, gc_enabled: bool) -> Timing:
    stopwatch = _common.Stopwatch(gc_enabled=gc_enabled)
    try:
        async with trio.open_nursery() as nursery:
            senders = start_trio_children(nursery, fanout, depth)
            await trio.testing.wait_all_tasks_blocked()
            stopwatch.start()
            for sender in senders:
                sender.close()
    finally:
        stopwatch.stop()
    return stopwatch.elapsed, stopwatch.cpu


VARIANTS: dict[str, tuple[str, Callable[[int, int, bool], Any]]] = {
    "bundle": ("a bundle per node, STOP through inboxes, shutdown()", bundle_tree),
    "trio": ("by hand: a nursery per node, memory channels closed", trio_tree),
}


def run(*, quick: bool = False, gc_enabled: bool = True) -> dict[str, Any]:
    """Run the benchmark; return its results as plain data (see `tables`)."""
    params = QUICK if quick else FULL
    names = list(VARIANTS)
    for name in names:  # imports and lazy set-up, unmeasured
        trio.run(VARIANTS[name][1], 2, 2, True)
    shapes = []
    for fanout, depths in params["shapes"].items():
        rows = []
        for depth in depths:
            leaves = fanout**depth
            samples = _common.interleave(
                names,
                repetitions_for(leaves, quick=quick),
                lambda name, f=fanout, d=depth: trio.run(
                    VARIANTS[name][1], f, d, gc_enabled
                ),
            )
            wall = {name: [w for w, _ in samples[name]] for name in names}
            cpu = {name: [c for _, c in samples[name]] for name in names}
            rows.append(
                {
                    "depth": depth,
                    "leaves": leaves,
                    "containers": sum(fanout**level for level in range(depth)),
                    "repetitions": len(cpu["bundle"]),
                    "cpu_s": {name: _common.summarize(cpu[name]) for name in names},
                    "wall_s": {name: _common.summarize(wall[name]) for name in names},
                    "cpu_ratio": {
                        name: _common.paired_ratio(cpu[name], cpu["trio"])
                        for name in names
                    },
                    "wall_ratio": {
                        name: _common.paired_ratio(wall[name], wall["trio"])
                        for name in names
                    },
                }
            )
        shapes.append(
            {
                "fanout": fanout,
                "rows": rows,
                "growth": growth(rows, names, "cpu_s"),
                "wall_growth": growth(rows, names, "wall_s"),
            }
        )
    return {
        "title": TITLE,
        "variants": {name: label for name, (label, _) in VARIANTS.items()},
        "shapes": shapes,
    }


def growth(rows: list[dict[str, Any]], names: list[str], key: str) -> dict[str, float]:
    """Per-leaf cost at the largest tree over the smallest, for each variant."""
    return {
        name: _common.growth(
            {row["leaves"]: row[key][name]["median"] / row["leaves"] for row in rows}
        )
        for name in names
    }


def tables(result: dict[str, Any]) -> list[_common.Table]:
    rows = []
    growths = []
    for shape in result["shapes"]:
        fanout = shape["fanout"]
        for row in shape["rows"]:
            for name in result["variants"]:
                cpu = row["cpu_s"][name]["median"]
                rows.append(
                    [
                        f"{fanout}^{row['depth']}",
                        f"{row['leaves']:,}",
                        f"{row['containers']:,}",
                        name,
                        _common.fmt_seconds(cpu),
                        _common.fmt_seconds(cpu / row["leaves"]),
                        _common.fmt_seconds(
                            row["wall_s"][name]["median"] / row["leaves"]
                        ),
                        _common.fmt_ratio(row["cpu_ratio"][name]),
                        _common.fmt_ratio(row["wall_ratio"][name]),
                    ]
                )
        for label, key in (("CPU time", "growth"), ("wall time", "wall_growth")):
            growths.append(
                f"fan-out {fanout}, {label}: "
                + ", ".join(
                    f"{name} {_common.fmt_ratio(value)}"
                    for name, value in shape[key].items()
                )
            )
    return [
        _common.Table(
            title=TITLE,
            columns=[
                "fan-out^depth",
                "leaves",
                "containers",
                "variant",
                "CPU time",
                "CPU per leaf",
                "wall per leaf",
                "CPU vs trio",
                "wall vs trio",
            ],
            rows=rows,
            notes=[
                _common.variants_note(result["variants"]),
                "Medians over the repetitions, from the root's shutdown until "
                "every node has ended.",
                "Linearity, per-leaf cost at the largest tree over the smallest: "
                + "; ".join(growths)
                + ".",
            ],
        )
    ]


def goals(result: dict[str, Any]) -> list[_common.Goal]:
    """Item 5's goal: the cost per leaf grows by at most 1.3 times."""
    found = []
    for shape in result["shapes"]:
        leaves = [row["leaves"] for row in shape["rows"]]
        growth = shape["growth"]["bundle"]
        found.append(
            _common.Goal(
                item=f"5. nested shutdown, fan-out {shape['fanout']}, per-leaf cost "
                f"at {max(leaves):,} over {min(leaves):,} leaves",
                target=f"≤ {_common.fmt_ratio(GOAL_GROWTH)}",
                measured=f"{_common.fmt_ratio(growth)} "
                f"(trio: {_common.fmt_ratio(shape['growth']['trio'])})",
                met=growth <= GOAL_GROWTH,
            )
        )
    return found


if __name__ == "__main__":
    _cli.run_one(sys.modules[__name__], _cli.argument_parser(__doc__).parse_args())
