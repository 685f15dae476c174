"""Traces miss nothing: every child end, and distinct paths for live namesakes."""

from __future__ import annotations

import math

import attrs
import trio
import trio.testing
from hypothesis import example, given, settings, strategies as st

from trio_graceful import (
    Bundle,
    ChildOutcome,
    TraceEvent,
    TraceKind,
    open_bundle,
    record_trace,
)
from trio_graceful._observe._timeline import rows
from trio_graceful.lowlevel import add_trace_hook, remove_trace_hook


async def test_a_hook_added_late_sees_every_child_of_a_hard_cancelled_bundle(
    autojump_clock,
):
    t0 = trio.current_time()
    done = trio.Event()

    async def middle() -> None:
        async with open_bundle(name="inner") as inner:
            for _ in range(2):
                inner.start_soon(trio.sleep_forever, name="leaf")
            await trio.sleep_forever()

    async def service(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        with trio.CancelScope() as parent:
            async with open_bundle(name="outer") as outer:
                outer.start_soon(middle, name="middle")
                task_status.started(parent)
                await trio.sleep_forever()
        done.set()

    async with trio.open_nursery() as nursery:
        parent = await nursery.start(service)
        await trio.sleep(1)
        # recorded only around the end, as observability.rst shows; no
        # bundle is cancelled with cancel(), only the scope around them all
        with record_trace() as trace:
            parent.cancel("shutting down")
            await done.wait()
    ended = {
        (e.time - t0, e.task, e.outcome) for e in trace.of_kind(TraceKind.CHILD_ENDED)
    }
    cancelled = ChildOutcome.CANCELLED
    assert ended == {
        (1, "outer/middle/inner/leaf", cancelled),
        (1, "outer/middle/inner/leaf#2", cancelled),
        (1, "outer/middle", cancelled),
    }
    assert len(trace.of_kind(TraceKind.CHILD_ENDED)) == 3


async def test_live_namesakes_keep_distinct_paths_whoever_asks_first(autojump_clock):
    async with open_bundle(name="pool") as pool:
        pool.start_soon(trio.sleep, 3, name="worker")  # before the recording
        await trio.sleep(1)
        with record_trace() as trace:
            pool.start_soon(trio.sleep, 1, name="worker")  # ends first
            await trio.sleep(3)
    lives = {e.task: e.time for e in trace.of_kind(TraceKind.CHILD_ENDED)}
    t0 = min(e.time for e in trace.events) - 1
    # numbered in the order they started, each path the same in every event
    assert {task: time - t0 for task, time in lives.items()} == {
        "pool/worker": 3,
        "pool/worker#2": 2,
    }
    assert [(e.kind, e.task) for e in trace.events if e.task] == [
        (TraceKind.CHILD_STARTED, "pool/worker#2"),
        (TraceKind.CHILD_ENDED, "pool/worker#2"),
        (TraceKind.CHILD_ENDED, "pool/worker"),
    ]


async def test_a_path_taken_again_later_is_a_row_of_its_own(autojump_clock):
    # a connection serving requests one after another, all "GET /work"
    with record_trace() as trace:
        async with open_bundle(name="conn") as conn:
            for seconds in (2, 3):
                conn.start_soon(trio.sleep, seconds, name="GET /work")
                await trio.sleep(seconds + 1)
    paths = [e.task for e in trace.of_kind(TraceKind.CHILD_ENDED)]
    assert paths == ["conn/GET /work", "conn/GET /work"]  # never alive together
    t0 = trace.events[0].time
    assert [
        (row.name, row.start - t0, row.end - t0)
        for row in rows(trace.events)
        if row.start is not None and row.end is not None
    ] == [("GET /work", 0, 2), ("GET /work (2)", 3, 6)]
    chrome = trace.to_chrome_trace(pid=1)["traceEvents"]
    lives = [(e["name"], e["tid"]) for e in chrome if e["ph"] == "X"]
    assert lives == [("GET /work", 1), ("GET /work (2)", 1)]


@attrs.frozen
class Leaf:
    name: str
    start: int
    seconds: int | None  # None: until cancelled


@attrs.frozen
class Inner:
    name: str
    start: int
    children: tuple[Leaf | Inner, ...]


def _trees(depth: int = 2) -> st.SearchStrategy[Leaf | Inner]:
    names = st.sampled_from(["a", "b"])  # few names: many namesakes
    leaf = st.builds(
        Leaf, names, st.integers(0, 4), st.one_of(st.none(), st.integers(0, 6))
    )
    if depth == 0:
        return leaf
    return st.one_of(
        leaf,
        st.builds(
            Inner,
            names,
            st.integers(0, 4),
            st.lists(_trees(depth - 1), max_size=4).map(tuple),
        ),
    )


@settings(max_examples=300, deadline=None)
# two namesakes started before the hook, both ended by the hard cancel
@example([Leaf("a", 0, None), Leaf("a", 0, None)], 1, None, 3)
@given(
    st.lists(_trees(), min_size=1, max_size=4),
    st.integers(0, 8),
    st.one_of(st.none(), st.integers(0, 8)),
    st.integers(1, 9),
)
def test_every_end_while_a_hook_is_installed_is_traced_once(
    tree: list[Leaf | Inner], added: int, kept: int | None, cancelled_at: int
) -> None:
    # Children end at whole seconds plus a fraction of their own (below 0.5);
    # the hook comes and goes at .75, the parent's hard cancel strikes at .9.
    fraction = iter(n / 1024 for n in range(1, 500))
    ends: list[float] = []
    events: list[TraceEvent] = []
    installed: list[float] = []

    async def run(node: Leaf | Inner) -> None:
        try:
            if isinstance(node, Leaf):
                if node.seconds is None:
                    await trio.sleep_forever()
                await trio.sleep(node.seconds + next(fraction))
                return
            async with open_bundle(name="nested") as bundle:
                await spawn(bundle, node.children)
        finally:
            ends.append(trio.current_time())

    async def spawn(bundle: Bundle, nodes: tuple[Leaf | Inner, ...]) -> None:
        t0 = trio.current_time()
        for node in sorted(nodes, key=lambda node: node.start):
            await trio.sleep_until(t0 + node.start)
            bundle.start_soon(run, node, name=node.name)

    async def hook_from_to() -> None:
        await trio.sleep(added + 0.75)
        add_trace_hook(events.append)
        installed.append(trio.current_time())
        if kept is not None:
            await trio.sleep(kept + 0.5)
            remove_trace_hook(events.append)
            installed.append(trio.current_time())

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hook_from_to)
            with trio.move_on_after(cancelled_at + 0.9):
                async with open_bundle(name="root") as root:
                    await spawn(root, tuple(tree))
                    await trio.sleep_forever()
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    start = installed[0] if installed else math.inf
    stop = installed[1] if len(installed) > 1 else math.inf
    ended = [e for e in events if e.kind is TraceKind.CHILD_ENDED]
    assert sorted(e.time for e in ended) == sorted(t for t in ends if start < t < stop)
    # Children alive together (all of them, at the hard cancel) differ: a
    # path ends a second time only if a child started under it in between.
    ended_paths: set[str] = set()
    for e in events:
        if e.kind is TraceKind.CHILD_STARTED:
            ended_paths.discard(e.task)
        elif e.kind is TraceKind.CHILD_ENDED:
            assert e.task not in ended_paths
            ended_paths.add(e.task)
