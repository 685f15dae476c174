"""Trace events, bundle paths and logging."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import sys
import time
from collections.abc import Iterator
from types import FrameType

import pytest
import trio
import trio.testing

from tests.support.scheduling import StepCounter
from trio_graceful import (
    STOP,
    CancelReport,
    ChildEnd,
    ChildOutcome,
    Trace,
    TraceEvent,
    TraceKind,
    open_bundle,
    open_inbox,
    record_trace,
)
from trio_graceful._core import _trace
from trio_graceful.lowlevel import add_trace_hook, remove_trace_hook

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup


def kinds(trace, *wanted):
    return [
        (e.time, e.kind.value, e.task or e.bundle)
        for e in trace.events
        if not wanted or e.kind in wanted
    ]


async def test_a_shutdown_recorded_end_to_end(autojump_clock):
    t0 = trio.current_time()

    async def worker(inbox):
        assert await inbox.receive() is STOP
        await trio.sleep(2)  # saying goodbye

    async def stuck():
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(1)  # an unwind that takes a while

    with record_trace() as trace:
        async with open_bundle(name="root") as root:
            _, inbox = root.open_inbox()
            root.start_soon(worker, inbox, name="worker")
            root.start_soon(stuck, name="stuck")
            await trio.sleep(1)
            await root.shutdown(grace=5)
    events = [(e.time - t0, e.kind, e.bundle, e.task) for e in trace.events]
    # children start in either order
    assert sorted(events[1:3], key=str) == [
        (0, TraceKind.CHILD_STARTED, "root", "root/stuck"),
        (0, TraceKind.CHILD_STARTED, "root", "root/worker"),
    ]
    me = trio.lowlevel.current_task().name
    assert [events[0], *events[3:]] == [
        (0, TraceKind.BUNDLE_OPENED, "root", None),
        (1, TraceKind.STOP_SENT, "root", me),
        (1, TraceKind.STOP_RECEIVED, "root", "root/worker"),
        (1, TraceKind.CANCEL_STARTED, "root", me),
        (3, TraceKind.CHILD_ENDED, "root", "root/worker"),
        (6, TraceKind.HARD_CANCEL, "root", None),
        (7, TraceKind.CHILD_ENDED, "root", "root/stuck"),
        (7, TraceKind.CANCEL_FINISHED, "root", None),
        (7, TraceKind.BUNDLE_CLOSED, "root", None),
    ]
    (started,) = trace.of_kind(TraceKind.CANCEL_STARTED)
    assert (started.grace, started.deadline) == (5, t0 + 6)
    (hard,) = trace.of_kind(TraceKind.HARD_CANCEL)
    assert (hard.deadline, hard.detail) == (t0 + 6, "the grace period ran out")
    ended = {e.task: e.outcome for e in trace.of_kind(TraceKind.CHILD_ENDED)}
    assert ended == {
        "root/worker": ChildOutcome.FINISHED,
        "root/stuck": ChildOutcome.CANCELLED,
    }
    (finished,) = trace.of_kind(TraceKind.CANCEL_FINISHED)
    assert finished.detail == (
        "bundle 'root': 1 finished, 1 hard-cancelled, 0 raised, in 6.000 s"
    )
    assert sorted(trace.tasks()) == sorted(["root/stuck", "root/worker", me])
    assert [e.kind for e in trace.of_task("root/worker")] == [
        TraceKind.CHILD_STARTED,
        TraceKind.STOP_RECEIVED,
        TraceKind.CHILD_ENDED,
    ]


async def test_hard_cancel_is_traced_at_a_deadline_moved_earlier(autojump_clock):
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery, open_bundle(name="b") as bundle:
        bundle.start_soon(trio.sleep_forever)
        with record_trace() as trace:
            nursery.start_soon(bundle.cancel, 10)
            await trio.sleep(1)
            await bundle.cancel(grace=2)
    (hard,) = trace.of_kind(TraceKind.HARD_CANCEL)
    assert hard.time - t0 == 3
    assert hard.deadline == t0 + 3
    assert [e.deadline for e in trace.of_kind(TraceKind.CANCEL_STARTED)] == [
        t0 + 10,
        t0 + 3,
    ]


async def test_explicit_hard_cancels_are_traced_with_their_reason(autojump_clock):
    async with open_bundle(name="b") as bundle:
        bundle.start_soon(trio.sleep_forever)
        with record_trace() as trace, trio.move_on_after(1):
            await bundle.cancel(grace=100)
    (hard,) = trace.of_kind(TraceKind.HARD_CANCEL)
    assert hard.detail == "the task waiting in cancel() of bundle 'b' was cancelled"


async def test_raising_child_is_traced(autojump_clock):
    async def boom():
        raise ValueError("no")

    with record_trace() as trace, pytest.raises(BaseExceptionGroup):
        async with open_bundle(name="b") as bundle:
            bundle.start_soon(boom, name="boom")
    (ended,) = trace.of_kind(TraceKind.CHILD_ENDED)
    assert (ended.task, ended.outcome, ended.detail) == (
        "b/boom",
        ChildOutcome.RAISED,
        "ValueError('no')",
    )


async def test_started_children_are_traced_when_ready(autojump_clock):
    async def server(*, task_status=trio.TASK_STATUS_IGNORED):
        await trio.sleep(2)
        task_status.started()

    with record_trace() as trace:
        async with open_bundle(name="b") as bundle:
            await bundle.start(server, name="server")
    assert kinds(trace, TraceKind.CHILD_STARTED, TraceKind.CHILD_ENDED) == [
        (2, "child started", "b/server"),
        (2, "child ended", "b/server"),
    ]


async def test_stop_events_of_a_plain_inbox(autojump_clock):
    tx, rx = open_inbox[int]()
    clone = rx.clone()
    me = trio.lowlevel.current_task().name
    with record_trace() as trace:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(rx.receive, name="waiting")
            await trio.testing.wait_all_tasks_blocked()
            tx.stop()
            tx.stop()  # a second stop() sends nothing
            assert clone.receive_nowait() is STOP
    assert sorted(kinds(trace)) == [
        (0, "STOP received", me),
        (0, "STOP received", "waiting"),
        (0, "STOP sent", me),
    ]


# -- paths in the tree of bundles ---------------------------------------------


async def test_bundle_paths(autojump_clock):
    paths: dict[str, str] = {}

    async def child_with_bundle():
        async with open_bundle(name="inner") as inner:
            paths["in a child"] = inner.path
            async with trio.open_nursery() as plain:
                plain.start_soon(grandchild, name="grandchild")

    async def grandchild():
        async with open_bundle(name="deep") as deep:
            paths["below a plain nursery"] = deep.path

    async with open_bundle(name="root") as root:
        paths["root"] = root.path
        root.start_soon(child_with_bundle, name="worker")
        async with open_bundle(name="side") as side:
            paths["in the body"] = side.path
    async with open_bundle(name="again") as again:
        paths["after"] = again.path
    assert paths == {
        "root": "root",
        "in a child": "root/worker/inner",
        "below a plain nursery": "root/worker/inner/grandchild/deep",
        "in the body": "root/side",
        "after": "again",
    }


async def test_children_sharing_a_name_get_paths_of_their_own(autojump_clock):
    async def handler(seconds):
        async with open_bundle(name="requests") as requests:
            requests.start_soon(trio.sleep, seconds, name="request")
        await trio.sleep(seconds)

    with record_trace() as trace:
        async with open_bundle(name="server") as server:
            for seconds in (3, 1, 2):
                server.start_soon(handler, seconds, name="handler")
    # numbered in the order they first ran, the same in every event
    ended = trace.of_kind(TraceKind.CHILD_ENDED)
    handlers = {e.time: e.task for e in ended if e.bundle == "server"}
    assert sorted(handlers[t] for t in (2, 4, 6)) == [
        "server/handler",
        "server/handler#2",
        "server/handler#3",
    ]
    assert {
        e.time: e.task.removesuffix("/requests/request")
        for e in ended
        if e.bundle != "server"
    } == {1: handlers[2], 2: handlers[4], 3: handlers[6]}
    for path in handlers.values():
        assert [e.kind for e in trace.of_task(path)] == [
            TraceKind.CHILD_STARTED,
            TraceKind.CHILD_ENDED,
        ]
    # a bundle that opens again later numbers its children from scratch
    with record_trace() as again:
        async with open_bundle(name="server") as server:
            server.start_soon(trio.sleep, 0, name="handler")
    assert again.tasks() == ["server/handler"]


# -- hooks -----------------------------------------------------------------------


async def test_hooks_are_called_and_removed(autojump_clock):
    seen: list[TraceEvent] = []
    add_trace_hook(seen.append)
    async with open_bundle(name="b"):
        pass
    remove_trace_hook(seen.append)
    async with open_bundle(name="quiet"):
        pass
    assert [e.kind for e in seen] == [TraceKind.BUNDLE_OPENED, TraceKind.BUNDLE_CLOSED]
    with pytest.raises(KeyError, match="is not installed in this run"):
        remove_trace_hook(seen.append)


async def test_a_failing_hook_is_removed_and_logged(autojump_clock, caplog):
    calls: list[TraceKind] = []

    def bad_hook(event):
        calls.append(event.kind)
        raise ZeroDivisionError

    add_trace_hook(bad_hook)
    async with open_bundle(name="b"):
        pass
    assert calls == [TraceKind.BUNDLE_OPENED]
    (record,) = [r for r in caplog.records if r.name == "trio_graceful"]
    assert record.levelno == logging.ERROR
    assert record.getMessage().startswith("trace hook <function")
    assert record.exc_info is not None
    with pytest.raises(KeyError):
        remove_trace_hook(bad_hook)


def test_hooks_need_a_trio_run():
    with pytest.raises(RuntimeError):
        add_trace_hook(print)


@contextlib.contextmanager
def calls_into_tracing() -> Iterator[list[str]]:
    """Record the functions of the tracing module called in the block.

    Tracing on means events built and handed out (``emit``); off, the hot
    paths check one counter and call nothing there.
    """
    calls: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code.co_filename == _trace.__file__:
            calls.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(None)


async def test_tracing_off_costs_no_wakeups_and_no_trace_work(autojump_clock):
    counter = StepCounter()
    trio.lowlevel.add_instrument(counter)
    try:
        async with open_bundle() as bundle:
            with calls_into_tracing() as calls:
                bundle.start_soon(trio.sleep, 0.05)
                me = trio.lowlevel.current_task()
                before = counter.steps.get(me, 0)
                await bundle.cancel(grace=100)
            assert counter.steps[me] - before == 1
    finally:
        trio.lowlevel.remove_instrument(counter)
    assert calls == []


def test_a_hook_left_installed_ends_with_its_run():
    events: list[TraceEvent] = []
    active = _trace.tracing.active

    async def leave_a_hook() -> None:
        add_trace_hook(events.append)
        assert _trace.tracing.active == active + 1
        async with open_bundle(name="traced") as bundle:
            bundle.start_soon(trio.sleep, 0)

    async def untraced() -> None:
        async with open_bundle(name="untraced") as bundle:
            with calls_into_tracing() as calls:
                bundle.start_soon(trio.sleep, 0)
                await bundle.cancel(grace=1)
        assert calls == []

    trio.run(leave_a_hook)
    assert _trace.tracing.active == active
    trio.run(untraced)
    assert {event.bundle for event in events} == {"traced"}


# -- logging -----------------------------------------------------------------------


async def test_long_drain_logs_progress_and_a_summary(autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="trio_graceful")
    async with open_bundle(name="root") as root:
        root.start_soon(trio.sleep_forever, name="stuck")
        root.start_soon(trio.sleep, 4.5, name="slow")
        async with open_bundle(name="nested") as nested:
            nested.start_soon(trio.sleep, 1)
            await nested.cancel(grace=10)  # nested: DEBUG, not shown
        await root.cancel(grace=7)
    lines = [r.getMessage() for r in caplog.records if r.name == "trio_graceful"]
    assert lines == [
        "bundle 'root': waiting for 2 children, 5.0 s of grace left",
        "bundle 'root': waiting for 1 child, 3.0 s of grace left",
        "bundle 'root': waiting for 1 child, 1.0 s of grace left",
        "bundle 'root': 1 finished, 1 hard-cancelled, 0 raised, in 7.000 s",
    ]
    assert all(r.levelno == logging.INFO for r in caplog.records)


async def test_nested_bundles_log_at_debug(autojump_clock, caplog):
    caplog.set_level(logging.DEBUG, logger="trio_graceful")
    async with open_bundle(name="root") as root:

        async def child():
            async with open_bundle(name="nested") as nested:
                await nested.cancel(grace=1)

        root.start_soon(child)
    (record,) = caplog.records
    assert record.levelno == logging.DEBUG
    # named by its path, as in traces: root/<the child task>/nested
    assert re.fullmatch(
        r"bundle 'root/[^/]+\.child/nested': 0 finished, 0 hard-cancelled, "
        r"0 raised, in 0\.000 s",
        record.getMessage(),
    )


async def test_on_stop_callbacks_are_traced_as_stop_received(autojump_clock):
    async def child():
        with bundle.on_stop(lambda: None):
            await trio.sleep(1)

    with record_trace() as trace:
        async with open_bundle(name="b") as bundle:
            bundle.start_soon(child, name="thread-like")
            await trio.testing.wait_all_tasks_blocked()
            await bundle.shutdown(grace=5)
    assert [(e.bundle, e.task) for e in trace.of_kind(TraceKind.STOP_RECEIVED)] == [
        ("b", "b/thread-like")
    ]


# -- arguments ---------------------------------------------------------------------


async def test_a_hook_that_cannot_be_called_is_refused_at_once():
    with pytest.raises(
        TypeError, match=r"^hook must be a callable taking a TraceEvent, not 5$"
    ):
        add_trace_hook(5)  # type: ignore[arg-type]
    with record_trace() as trace:
        async with open_bundle(name="b"):
            pass
    # nothing was installed: the recording is the only hook
    assert [e.kind for e in trace.events] == [
        TraceKind.BUNDLE_OPENED,
        TraceKind.BUNDLE_CLOSED,
    ]
    with pytest.raises(TypeError, match=r"^kind must be a TraceKind, not 'x'$"):
        trace.of_kind("x")  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"^task must be a task path \(a string\), not 1$"
    ):
        trace.of_task(1)  # type: ignore[arg-type]


# -- leaving the process: JSON and Chrome traces ---------------------------------------


async def record_a_drain() -> Trace:
    async def worker(inbox):
        assert await inbox.receive() is STOP
        await trio.sleep(2)

    with record_trace() as trace:
        async with open_bundle(name="root") as root:
            _, inbox = root.open_inbox()
            root.start_soon(worker, inbox, name="worker")
            root.start_soon(trio.sleep_forever, name="stuck")
            await trio.sleep(1)
            await root.shutdown(grace=5)
            await root.cancel(grace=math.inf)  # an infinite grace, too
    return trace


async def test_a_trace_goes_to_json_and_back(autojump_clock):
    before = time.time()
    t0 = trio.current_time()
    trace = await record_a_drain()
    after = time.time()
    assert trace.wall_clock_offset is not None
    # taken when the recording started, on the mock clock: t0 is that moment
    assert before <= t0 + trace.wall_clock_offset <= after
    text = trace.to_json(indent=2)
    loaded = Trace.from_json(text)
    assert loaded == trace
    assert Trace.from_dict(json.loads(text)) == trace
    data = json.loads(text)
    hard = next(e for e in data["events"] if e["kind"] == "hard cancel")
    assert hard["time"] - t0 == 6
    assert hard["time_wall"] == hard["time"] + trace.wall_clock_offset
    assert hard["deadline_wall"] == hard["deadline"] + trace.wall_clock_offset
    ended = [e["outcome"] for e in data["events"] if e["kind"] == "child ended"]
    assert ended == ["finished", "cancelled"]
    (forever, *_) = [e for e in data["events"] if e["grace"] == "inf"]
    assert forever["kind"] == "cancel started"


def test_json_of_a_trace_names_what_is_wrong():
    with pytest.raises(TypeError, match=r"^text must be a str or bytes, not 5$"):
        Trace.from_json(5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^text must hold a JSON object, not \[\]$"):
        Trace.from_json("[]")
    with pytest.raises(ValueError, match=r"^events must be a list, not None$"):
        Trace.from_json("{}")
    event = TraceEvent(TraceKind.HARD_CANCEL, 1.0, "b").as_dict()
    with pytest.raises(ValueError, match=r"^kind must be one of \["):
        TraceEvent.from_dict({**event, "kind": "exploded"})
    with pytest.raises(ValueError, match=r"^time must be a number or 'inf', not '1'$"):
        TraceEvent.from_dict({**event, "time": "1"})
    with pytest.raises(TypeError, match=r"^data must be a mapping decoded from JSON"):
        TraceEvent.from_dict([])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^indent must be an int or None, not '  '$"):
        Trace().to_json(indent="  ")  # type: ignore[arg-type]
    # without a recording's offset, no wall-clock times
    assert Trace([TraceEvent(TraceKind.HARD_CANCEL, 1.0, "b")]).as_dict() == {
        "wall_clock_offset": None,
        "events": [event],
    }
    assert event["time_wall"] is None


async def test_a_cancel_report_goes_to_json_and_back(autojump_clock):
    async def noted():
        bundle.note("exit status 0")
        await trio.sleep_forever()

    before = time.time()
    async with open_bundle(name="b") as bundle:
        bundle.start_soon(noted, name="noted")
        bundle.start_soon(trio.sleep, 1, name="quick")
        await trio.testing.wait_all_tasks_blocked()
        report = await bundle.cancel(grace=3)
    assert report.wall_clock_offset is not None
    # taken when the report was made, at its end
    assert before <= report.finished_at + report.wall_clock_offset <= time.time()
    data = json.loads(report.to_json())
    assert CancelReport.from_json(report.to_json()) == report
    assert CancelReport.from_dict(report.as_dict()) == report
    offset = report.wall_clock_offset
    assert data["hard_cancelled_at_wall"] == report.hard_cancelled_at + offset
    assert data["finished_at_wall"] == report.finished_at + offset
    assert [(c["name"], c["outcome"], c["notes"]) for c in data["children"]] == [
        ("quick", "finished", []),
        ("noted", "cancelled", ["exit status 0"]),
    ]
    assert data["children"][1]["ended_at_wall"] == report.children[1].ended_at + offset


def test_a_report_made_outside_a_run_has_no_wall_clock():
    report = CancelReport(
        bundle="b",
        started_at=1.0,
        finished_at=2.0,
        hard_deadline=math.inf,
        hard_cancelled_at=None,
        children=(ChildEnd("c", ChildOutcome.RAISED, 2.0, 1.0, error="E()"),),
    )
    assert report.wall_clock_offset is None
    data = report.as_dict()
    assert (data["hard_deadline"], data["hard_deadline_wall"]) == ("inf", None)
    assert CancelReport.from_json(report.to_json()) == report
    with pytest.raises(ValueError, match=r"^outcome must be one of \['finished', "):
        ChildEnd.from_dict({**data["children"][0], "outcome": None})
    with pytest.raises(
        ValueError, match=r"^notes must be a list of strings, not \[1\]$"
    ):
        ChildEnd.from_dict({**data["children"][0], "notes": [1]})


async def test_chrome_trace_event_format(autojump_clock):
    t0 = trio.current_time()
    trace = await record_a_drain()
    chrome = trace.to_chrome_trace(pid=42, process_name="drain")
    json.dumps(chrome, allow_nan=False)  # strict JSON, as Perfetto reads it
    events = chrome["traceEvents"]
    for event in events:
        assert {"name", "ph", "ts", "pid", "tid"} <= event.keys()
        assert event["pid"] == 42
        assert event["ph"] in {"X", "i", "M"}
        if event["ph"] == "X":
            assert event["dur"] >= 0
        if event["ph"] == "i":
            assert event["s"] in {"t", "p"}
    threads = {
        e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"
    }
    me = trio.lowlevel.current_task().name  # a qualified function name
    assert threads == {0: "bundles", 1: "stuck", 2: "worker", 3: me.split(".")[-1]}
    (process,) = [e for e in events if e["name"] == "process_name"]
    assert process["args"] == {"name": "drain"}

    def us(trio_time):  # wall-clock microseconds
        return (trio_time + trace.wall_clock_offset) * 1e6

    lives = {e["name"]: e for e in events if e["ph"] == "X"}
    assert lives.keys() == {"worker", "stuck"}
    assert lives["worker"]["ts"] == us(t0)
    assert lives["worker"]["dur"] == pytest.approx(3e6)
    assert lives["worker"]["args"] == {
        "path": "root/worker",
        "bundle": "root",
        "outcome": "finished",
    }
    assert lives["stuck"]["dur"] == pytest.approx(6e6)
    assert lives["stuck"]["args"]["outcome"] == "cancelled"
    instants = [
        (e["name"], e["tid"], e["s"], round(e["ts"] - us(t0)))
        for e in events
        if e["ph"] == "i" and e["name"] != "bundle opened: root"
    ]
    assert instants[:5] == [
        ("STOP sent", 3, "t", 1_000_000),
        ("STOP received", 2, "t", 1_000_000),
        ("cancel started: root", 0, "p", 1_000_000),
        ("hard cancel: root", 0, "p", 6_000_000),
        ("cancel finished: root", 0, "p", 6_000_000),
    ]
    with pytest.raises(TypeError, match=r"^pid must be an int or None, not '1'$"):
        trace.to_chrome_trace(pid="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^process_name must be a string, not None$"):
        trace.to_chrome_trace(process_name=None)  # type: ignore[arg-type]
