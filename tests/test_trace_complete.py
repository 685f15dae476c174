"""Traces miss nothing: every child end, and distinct paths for live namesakes."""

from __future__ import annotations

import trio
import trio.testing

from trio_graceful import (
    ChildOutcome,
    TraceKind,
    open_bundle,
    record_trace,
)
from trio_graceful._timeline import rows


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
