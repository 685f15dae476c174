"""Instructions per scenario, bundle against raw Trio: steadier than times.

Times on a shared machine wobble by tens of percent; instruction counts do
not. Each scenario runs in a fresh interpreter under Valgrind's callgrind
(``valgrind --tool=callgrind``), once with its size and once with size 0;
the difference is what the scenario itself cost, without the interpreter's
start and the imports. The garbage collector is off unless ``gc_enabled``,
so that the counts show the code's own work (the collector's passes are in
the timed benchmarks).

Scenarios, each for ``trio`` (a nursery, memory channels written by hand)
and ``bundle`` (trio_graceful):

* ``flat N``: one container, N trivial children (items 1 and 2 of spawn);
* ``tree FxD``: every inner node of a tree of fan-out F and depth D opens a
  container for its F children;
* ``shutdown N``: N children each waiting on an inbox (a memory channel),
  stopped gracefully: ``bundle.shutdown(grace)`` against closing the
  channels and putting a deadline on the nursery by hand.

A quick run does not count (Valgrind makes it take minutes): it runs each
scenario once, natively, so that the scenarios stay correct.

Run ``python bench/bench_instructions.py`` for this benchmark alone.
"""

from __future__ import annotations

import gc
import re
import shutil
import subprocess
import sys
from typing import Any

import _cli
import _common
import trio
import trio.testing

# Imported here, not read on first use: the package loads the core when
# open_bundle is first read, and the run with size 0 must load it too.
from trio_graceful import open_bundle

TITLE = "8. Instructions per scenario (callgrind)"

FULL = {
    "scenarios": (
        ("flat", 10_000),
        ("flat", 100_000),
        ("tree", "2x10"),
        ("tree", "10x4"),
        ("shutdown", 1_000),
        ("shutdown", 10_000),
    )
}
QUICK = {"scenarios": (("flat", 100), ("tree", "2x3"), ("shutdown", 100))}
VARIANTS = {"trio": "trio.open_nursery and memory channels", "bundle": "trio_graceful"}
GOALS = {"flat": 1.05, "tree": 1.5, "shutdown": 1.2}


async def _trivial() -> None:
    pass


async def _drain(receiver: Any) -> None:
    async for _ in receiver:
        pass


async def _node(variant: str, fan: int, depth: int) -> None:
    if depth == 0:
        return
    opener = trio.open_nursery if variant == "trio" else open_bundle
    async with opener() as container:
        for _ in range(fan):
            container.start_soon(_node, variant, fan, depth - 1)


async def _flat(variant: str, children: int) -> None:
    opener = trio.open_nursery if variant == "trio" else open_bundle
    async with opener() as container:
        for _ in range(children):
            container.start_soon(_trivial)


async def _shutdown(variant: str, children: int) -> None:
    if variant == "trio":
        async with trio.open_nursery() as nursery:
            senders = []
            for _ in range(children):
                sender, receiver = trio.open_memory_channel[object](0)
                senders.append(sender)
                nursery.start_soon(_drain, receiver)
            await trio.testing.wait_all_tasks_blocked()
            for sender in senders:
                sender.close()
            nursery.cancel_scope.deadline = trio.current_time() + 10
        return
    async with open_bundle() as bundle:
        for _ in range(children):
            _, inbox = bundle.open_inbox(0)
            bundle.start_soon(_drain, inbox)
        await trio.testing.wait_all_tasks_blocked()
        await bundle.shutdown(grace=10)


def scenario(variant: str, kind: str, size: int | str) -> None:
    """Run one scenario in this process; size 0 (or ``"0"``) runs nothing."""
    if size in (0, "0"):
        trio.run(trio.lowlevel.checkpoint)
    elif kind == "flat":
        trio.run(_flat, variant, int(size))
    elif kind == "tree":
        fan, depth = map(int, str(size).split("x"))
        trio.run(_node, variant, fan, depth)
    else:
        trio.run(_shutdown, variant, int(size))


def _count(variant: str, kind: str, size: int | str, *, gc_enabled: bool) -> int:
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        __file__,
        "--scenario",
        variant,
        kind,
        str(size),
    ]
    if not gc_enabled:
        command.append("--no-gc")
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    match = re.search(r"Collected : (\d+)", done.stderr)
    if match is None:
        raise RuntimeError(f"callgrind printed no count:\n{done.stderr}")
    return int(match.group(1))


def run(*, quick: bool = False, gc_enabled: bool = False) -> dict[str, Any]:
    """Count (or, quick, just run) every scenario; see the module docstring."""
    params = QUICK if quick else FULL
    counting = not quick and shutil.which("valgrind") is not None
    rows = []
    for kind, size in params["scenarios"]:
        row: dict[str, Any] = {"kind": kind, "size": size, "instructions": {}}
        for variant in VARIANTS:
            if counting:
                base = _count(variant, kind, 0, gc_enabled=gc_enabled)
                total = _count(variant, kind, size, gc_enabled=gc_enabled)
                row["instructions"][variant] = total - base
            else:
                scenario(variant, kind, size)
        rows.append(row)
    return {"counted": counting, "gc_enabled": gc_enabled, "rows": rows}


def _ratio(row: dict[str, Any]) -> float:
    counts = row["instructions"]
    return counts["bundle"] / counts["trio"]


def _scenario_name(row: dict[str, Any]) -> str:
    size = row["size"]
    return (
        f"{row['kind']} {size:,}" if isinstance(size, int) else f"{row['kind']} {size}"
    )


def tables(result: dict[str, Any]) -> list[_common.Table]:
    if not result["counted"]:
        note = "Not counted: a quick run, or Valgrind is not installed."
        rows = [[_scenario_name(row), "ran"] for row in result["rows"]]
        return [_common.Table(TITLE, ["scenario", "not counted"], rows, notes=[note])]
    rows = [
        [
            _scenario_name(row),
            f"{row['instructions']['trio']:,}",
            f"{row['instructions']['bundle']:,}",
            _common.fmt_ratio(_ratio(row)),
        ]
        for row in result["rows"]
    ]
    notes = [
        _common.variants_note(VARIANTS),
        "Instructions of the scenario alone (a run with size 0 subtracted); "
        + ("collector on." if result["gc_enabled"] else "collector off."),
    ]
    return [
        _common.Table(
            TITLE, ["scenario", "trio", "bundle", "bundle/trio"], rows, notes=notes
        )
    ]


def goals(result: dict[str, Any]) -> list[_common.Goal]:
    if not result["counted"]:
        return []
    return [
        _common.Goal(
            item=f"8. instructions, {_scenario_name(row)}",
            target=f"<= {_common.fmt_ratio(GOALS[row['kind']])}",
            measured=_common.fmt_ratio(_ratio(row)),
            met=_ratio(row) <= GOALS[row["kind"]],
        )
        for row in result["rows"]
    ]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--scenario"]:  # one measured run, under callgrind
        if "--no-gc" in sys.argv:
            gc.disable()
        scenario(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        _cli.run_one(sys.modules[__name__], _cli.argument_parser(__doc__).parse_args())
