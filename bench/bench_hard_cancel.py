"""Hard-cancel lateness: from the grace's deadline to the children being cancelled.

The children wait forever; the parent calls ``bundle.cancel(grace)`` with a
short grace. Each child notes `trio.current_time` when `trio.Cancelled`
reaches it; the lateness is that time minus the bundle's hard deadline. Also
measured: how long after the deadline ``cancel()`` returns. For comparison,
the same children in a nursery and in an anyio task group whose cancel
scope is given the same deadline.

Many samples, interleaved, all in one ``trio.run`` on the real clock;
median and 99th percentile.

Run ``python bench/bench_hard_cancel.py [--quick]`` for this benchmark
alone, or ``python bench/run_all.py`` for all of them.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import _cli
import _common
import trio
import trio.testing

import trio_graceful

TITLE = "3. Hard-cancel lateness: deadline to the children being cancelled"

FULL = {"children": (1, 100), "samples": 500, "grace": 2e-3}
QUICK = {"children": (1, 10), "samples": 10, "grace": 1e-3}

PHASES = ("whole ms", "random")
GOAL_SECONDS = 1e-3

# Seconds after the deadline: the first child cancelled, the last one, and
# the waiting task resuming.
Lateness = tuple[float, float, float]


async def wait_for_cancel(cancelled_at: list[float]) -> None:
    try:
        await trio.sleep_forever()
    finally:
        cancelled_at.append(trio.current_time())


def _lateness(cancelled_at: list[float], returned: float, deadline: float) -> Lateness:
    return (
        min(cancelled_at) - deadline,
        max(cancelled_at) - deadline,
        returned - deadline,
    )


async def bundle_cancel(children: int, grace: float) -> Lateness:
    cancelled_at: list[float] = []
    async with trio_graceful.open_bundle() as bundle:
        for _ in range(children):
            bundle.start_soon(wait_for_cancel, cancelled_at)
        await trio.testing.wait_all_tasks_blocked()
        await bundle.cancel(grace)
        returned = trio.current_time()
    return _lateness(cancelled_at, returned, bundle.hard_deadline)


async def nursery_deadline(children: int, grace: float) -> Lateness:
    cancelled_at: list[float] = []
    async with trio.open_nursery() as nursery:
        for _ in range(children):
            nursery.start_soon(wait_for_cancel, cancelled_at)
        await trio.testing.wait_all_tasks_blocked()
        deadline = nursery.cancel_scope.deadline = trio.current_time() + grace
    return _lateness(cancelled_at, trio.current_time(), deadline)


async def task_group_deadline(children: int, grace: float) -> Lateness:
    anyio = _common.anyio
    assert anyio is not None
    cancelled_at: list[float] = []
    async with anyio.create_task_group() as task_group:
        for _ in range(children):
            task_group.start_soon(wait_for_cancel, cancelled_at)
        await trio.testing.wait_all_tasks_blocked()
        deadline = task_group.cancel_scope.deadline = anyio.current_time() + grace
    return _lateness(cancelled_at, trio.current_time(), deadline)


def variants() -> dict[str, tuple[str, Callable[[int, float], Awaitable[Lateness]]]]:
    """What is measured, by variant name: a label and the sampling function."""
    found: dict[str, tuple[str, Callable[[int, float], Awaitable[Lateness]]]] = {
        "bundle": ("await bundle.cancel(grace)", bundle_cancel),
        "trio": ("nursery.cancel_scope.deadline = now + grace", nursery_deadline),
    }
    if _common.anyio is not None:
        found["anyio"] = (
            "task_group.cancel_scope.deadline = now + grace",
            task_group_deadline,
        )
    return found


def graces(base: float, phase: str, samples: int) -> list[float]:
    """The grace of each repetition.

    "whole ms": every grace is ``base``, a whole number of milliseconds.
    "random": ``base`` plus a random fraction of a millisecond (the same
    for every variant of a repetition), so that the deadline falls anywhere
    between the event loop's wake-ups.
    """
    if phase == "whole ms":
        return [base] * samples
    rng = random.Random(8)
    return [base + rng.uniform(0, 1e-3) for _ in range(samples)]


def run(*, quick: bool = False, gc_enabled: bool = True) -> dict[str, Any]:
    """Run the benchmark; return its results as plain data (see `tables`)."""
    params = QUICK if quick else FULL
    found = variants()

    async def main() -> list[dict[str, Any]]:
        rows = []
        for name in found:  # imports and lazy set-up, unmeasured
            await found[name][1](1, 0)
        with _common.collector(enabled=gc_enabled):
            for children in params["children"]:
                for phase in PHASES:
                    grace = graces(params["grace"], phase, params["samples"])
                    samples: dict[str, list[Lateness]] = {name: [] for name in found}
                    for rep, name in _common.schedule(list(found), params["samples"]):
                        sample = await found[name][1](children, grace[rep])
                        samples[name].append(sample)
                    rows.append(
                        {
                            "children": children,
                            "phase": phase,
                            **{
                                key: {
                                    name: _common.summarize([s[i] for s in values])
                                    for name, values in samples.items()
                                }
                                for i, key in enumerate(
                                    (
                                        "first_cancelled_s",
                                        "last_cancelled_s",
                                        "returned_s",
                                    )
                                )
                            },
                        }
                    )
        return rows

    return {
        "title": TITLE,
        "variants": {name: label for name, (label, _) in found.items()},
        "missing": [] if _common.anyio is not None else [_common.ANYIO_MISSING],
        "samples": params["samples"],
        "grace_s": params["grace"],
        "rows": trio.run(main),
    }


def tables(result: dict[str, Any]) -> list[_common.Table]:
    rows = []
    for row in result["rows"]:
        for name in result["variants"]:
            first = row["first_cancelled_s"][name]
            last = row["last_cancelled_s"][name]
            returned = row["returned_s"][name]
            rows.append(
                [
                    f"{row['children']:,}",
                    row["phase"],
                    name,
                    _common.fmt_seconds(first["median"]),
                    _common.fmt_seconds(last["median"]),
                    _common.fmt_seconds(last["p99"]),
                    _common.fmt_seconds(returned["median"]),
                    _common.fmt_seconds(returned["p99"]),
                ]
            )
    return [
        _common.Table(
            title=TITLE,
            columns=[
                "children",
                "grace",
                "variant",
                "first cancelled, median",
                "last cancelled, median",
                "last cancelled, p99",
                "waiter resumes, median",
                "waiter resumes, p99",
            ],
            rows=rows,
            notes=[
                f"{result['samples']:,} samples per line, real clock; every figure "
                "is the time after the deadline. Grace: "
                f"{_common.fmt_seconds(result['grace_s'])} ('whole ms'), or that "
                "plus a random fraction of a millisecond ('random'). "
                + _common.variants_note(result["variants"]),
                *result["missing"],
            ],
        )
    ]


def goals(result: dict[str, Any]) -> list[_common.Goal]:
    """Item 3's goal: the children are cancelled within 1 ms of the deadline."""
    found = []
    for row in result["rows"]:
        if row["children"] != 1:
            continue
        for statistic in ("median", "p99"):
            late = row["last_cancelled_s"]["bundle"][statistic]
            found.append(
                _common.Goal(
                    item=f"3. hard-cancel lateness, 1 child, {row['phase']} grace, "
                    f"{statistic}",
                    target=f"< {_common.fmt_seconds(GOAL_SECONDS)}",
                    measured=_common.fmt_seconds(late),
                    met=late < GOAL_SECONDS,
                )
            )
    return found


if __name__ == "__main__":
    _cli.run_one(sys.modules[__name__], _cli.argument_parser(__doc__).parse_args())
