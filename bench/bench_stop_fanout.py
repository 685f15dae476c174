"""STOP fan-out and drain: N inboxes stopped by one ``shutdown()``.

N children each wait for their next message in an inbox of one bundle
(``async for message in inbox``). Once all of them are waiting, the parent
calls ``await bundle.shutdown(grace)``: STOP goes to every inbox, every child
leaves its loop and returns, and ``shutdown()`` returns. Measured from the
call to its return (total), and from the call to the first child leaving
its loop (fan-out). For comparison, the same drain written by hand on Trio:
N memory channels, the parent closes every sender (the children see
end-of-channel) and leaves the nursery block.

The questions are whether the cost per child stays flat from 1,000 to
100,000 children, and how far it is from the hand-written drain (goal: at
most 1.2 times its CPU time). Opening the inboxes is measured apart, against
opening as many memory channels. Each sample is a fresh ``trio.run``; the
variants are interleaved.

Instruction counts are steadier than times on a busy machine. Where
``valgrind`` is installed, the full run also counts the instructions of the
whole cycle (open, start, shut down, in a fresh process under
``valgrind --tool=callgrind``) at 100 and at 2,000 children, and reports the
difference per added child; and the same for opening alone.

Run ``python bench/bench_stop_fanout.py [--quick]`` for this benchmark
alone, or ``python bench/run_all.py`` for all of them.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
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
GOAL_RATIO = 1.2
# Children per instruction count (each count runs under valgrind, ~50x slower).
COUNTED = 2_000
FEW = 100

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


async def drained_by_hand(
    children: int,
    gc_enabled: bool,
    open_pair: Callable[[], tuple[Any, Any]],
    end: Callable[[Any], object],
) -> Drain:
    """Open ``children`` channels, one child drains each; ``end`` every sender."""
    left: list[float] = []
    stopwatch = _common.Stopwatch(gc_enabled=gc_enabled)
    try:
        async with trio.open_nursery() as nursery:
            senders = []
            for _ in range(children):
                sender, receiver = open_pair()
                senders.append(sender)
                nursery.start_soon(drain, receiver, left)
            await trio.testing.wait_all_tasks_blocked()
            stopwatch.start()
            for sender in senders:
                end(sender)
    finally:
        stopwatch.stop()
    return min(left) - stopwatch.started_at, stopwatch.elapsed, stopwatch.cpu


async def channels_closed(children: int, gc_enabled: bool) -> Drain:
    return await drained_by_hand(
        children,
        gc_enabled,
        functools.partial(trio.open_memory_channel[object], 0),
        trio.MemorySendChannel.close,
    )


async def inboxes_stopped(children: int, gc_enabled: bool) -> Drain:
    return await drained_by_hand(
        children, gc_enabled, trio_graceful.open_inbox, trio_graceful.InboxSender.stop
    )


async def opened(
    children: int, gc_enabled: bool, open_pair: Callable[[], object]
) -> Drain:
    """CPU and wall time of opening ``children`` channels."""
    with _common.Stopwatch(gc_enabled=gc_enabled) as stopwatch:
        pairs = [open_pair() for _ in range(children)]
    del pairs
    return 0.0, stopwatch.elapsed, stopwatch.cpu


async def open_inboxes(children: int, gc_enabled: bool) -> Drain:
    return await opened(children, gc_enabled, trio_graceful.open_inbox)


async def open_bundle_inboxes(children: int, gc_enabled: bool) -> Drain:
    async with trio_graceful.open_bundle() as bundle:
        return await opened(children, gc_enabled, bundle.open_inbox)


async def open_channels(children: int, gc_enabled: bool) -> Drain:
    return await opened(
        children, gc_enabled, functools.partial(trio.open_memory_channel[object], 0)
    )


OPENERS: dict[str, Callable[[int, bool], Any]] = {
    "bundle": open_bundle_inboxes,
    "trio": open_channels,
    "inbox": open_inboxes,
}

# What is counted in a process of its own: name -> (label, program).
COUNTED_PROGRAMS: dict[str, tuple[str, Callable[[int, bool], Any]]] = {
    "cycle bundle": ("open, start, bundle.shutdown()", bundle_shutdown),
    "cycle trio": ("open, start, close the channels", channels_closed),
    "cycle inbox": ("open, start, stop() the inboxes", inboxes_stopped),
    "open inbox": ("open_inbox()", open_inboxes),
    "open bundle": ("bundle.open_inbox()", open_bundle_inboxes),
    "open trio": ("trio.open_memory_channel()", open_channels),
}


def count_instructions(program: str, children: int) -> int:
    """Instructions of one process that runs ``program`` once (callgrind)."""
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            os.path.abspath(__file__),
            "--count-one",
            program,
            str(children),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    match = re.search(r"Collected : (\d+)", done.stderr)
    if match is None:
        raise RuntimeError(f"callgrind reported no count: {done.stderr[-500:]}")
    return int(match.group(1))


def instructions_per_child(children: int) -> dict[str, float]:
    """For each counted program, instructions per child: the slope between
    a run with `FEW` children and one with ``children``."""
    return {
        name: (count_instructions(name, children) - count_instructions(name, FEW))
        / (children - FEW)
        for name in COUNTED_PROGRAMS
    }


VARIANTS: dict[str, tuple[str, Callable[[int, bool], Any]]] = {
    "bundle": ("STOP to N inboxes: await bundle.shutdown(grace)", bundle_shutdown),
    "trio": ("by hand: close N memory channels, leave the nursery", channels_closed),
    "inbox": ("by hand: stop() N inboxes, leave the nursery", inboxes_stopped),
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
        opened = _common.interleave(
            names,
            repetitions_for(children, quick=quick),
            lambda name, n=children: trio.run(OPENERS[name], n, gc_enabled),
        )
        open_cpu = {name: [sample[2] for sample in opened[name]] for name in names}
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
                "open_cpu_s": {
                    name: _common.summarize(open_cpu[name]) for name in names
                },
                "open_cpu_ratio": {
                    name: _common.paired_ratio(open_cpu[name], open_cpu["trio"])
                    for name in names
                },
            }
        )
    counted = not quick and shutil.which("valgrind") is not None
    return {
        "title": TITLE,
        "variants": {name: label for name, (label, _) in VARIANTS.items()},
        "rows": rows,
        "growth": growth(rows, names, "cpu_s"),
        "wall_growth": growth(rows, names, "wall_s"),
        "instructions": (
            {"children": COUNTED, "per_child": instructions_per_child(COUNTED)}
            if counted
            else None
        ),
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
                    _common.fmt_seconds(row["open_cpu_s"][name]["median"] / n),
                    _common.fmt_ratio(row["open_cpu_ratio"][name]),
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
                "open per child",
                "open vs trio",
            ],
            rows=rows,
            notes=[
                _common.variants_note(result["variants"]),
                "Medians over the repetitions, from the start of the shutdown until "
                "every child has ended; first child out (wall time): until the "
                "first child left its loop.",
                "Linearity, per-child cost at the largest size over the smallest: "
                f"CPU time {cpu_growth}; wall time {wall_growth}.",
                "Open: CPU time of opening N inboxes (bundle: with "
                "bundle.open_inbox(); inbox: with open_inbox()) or N memory "
                "channels (trio), per child, and the paired ratio.",
            ],
        ),
        *instruction_tables(result),
    ]


def instruction_tables(result: dict[str, Any]) -> list[_common.Table]:
    counts = result.get("instructions")
    if counts is None:
        return []
    per_child = counts["per_child"]
    rows = [
        [
            what,
            COUNTED_PROGRAMS[f"{what} {name}"][0],
            f"{per_child[f'{what} {name}']:,.0f}",
            _common.fmt_ratio(per_child[f"{what} {name}"] / per_child[f"{what} trio"]),
        ]
        for what, name in (
            ("cycle", "trio"),
            ("cycle", "inbox"),
            ("cycle", "bundle"),
            ("open", "trio"),
            ("open", "inbox"),
            ("open", "bundle"),
        )
    ]
    return [
        _common.Table(
            title=f"{TITLE}: instructions per child",
            columns=["measured", "program", "instructions per child", "vs trio"],
            rows=rows,
            notes=[
                "Counted by valgrind --tool=callgrind over a whole process that "
                f"runs the program once with {counts['children']:,} children, "
                f"minus the same process with {FEW}, divided by the difference.",
            ],
        )
    ]


def goals(result: dict[str, Any]) -> list[_common.Goal]:
    """Item 4's goals: a flat cost per child, at most 1.2x the hand-written drain."""
    sizes = [row["children"] for row in result["rows"]]
    growth = result["growth"]["bundle"]
    worst = max(row["cpu_ratio"]["bundle"] for row in result["rows"])
    return [
        _common.Goal(
            item=f"4. STOP fan-out, CPU time vs the hand-written drain, "
            f"{min(sizes):,} to {max(sizes):,} children (worst size)",
            target=f"≤ {_common.fmt_ratio(GOAL_RATIO)}",
            measured=_common.fmt_ratio(worst),
            met=worst <= GOAL_RATIO,
        ),
        _common.Goal(
            item=f"4. STOP fan-out, per-child cost at {max(sizes):,} "
            f"over {min(sizes):,}",
            target=f"≤ {_common.fmt_ratio(GOAL_GROWTH)}",
            measured=f"{_common.fmt_ratio(growth)} "
            f"(trio: {_common.fmt_ratio(result['growth']['trio'])})",
            met=growth <= GOAL_GROWTH,
        ),
    ]


if __name__ == "__main__" and sys.argv[1:2] == ["--count-one"]:
    # One counted program, in this process (see count_instructions).
    trio.run(COUNTED_PROGRAMS[sys.argv[2]][1], int(sys.argv[3]), True)
elif __name__ == "__main__":
    _cli.run_one(sys.modules[__name__], _cli.argument_parser(__doc__).parse_args())
