"""Regression tests of the bundle core: per-run state, defaults, callers, reports."""

from __future__ import annotations

import gc
import logging
import math
import re
import signal
import sys
import threading

import pytest
import trio
import trio.lowlevel
import trio.testing

from tests.support.exception_shapes import capture, shape
from trio_graceful import (
    ChildOutcome,
    TraceEvent,
    TraceKind,
    current_bundle,
    open_bundle,
    record_trace,
)
from trio_graceful.lowlevel import TraceHook, add_trace_hook, remove_trace_hook

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup

# -- state that belongs to one Trio run -----------------------------------------


def test_paths_of_two_runs_in_two_threads_are_their_own():
    both_inside = threading.Barrier(2, timeout=60)
    paths: dict[int, list[str]] = {}

    async def handler() -> None:
        await trio.to_thread.run_sync(both_inside.wait)

    async def one_run(index: int) -> None:
        with record_trace() as trace:
            async with open_bundle(name="root") as root:
                root.start_soon(handler, name="handler")
        paths[index] = trace.tasks()

    threads = [
        threading.Thread(target=trio.run, args=(one_run, index)) for index in (0, 1)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert paths == {0: ["root/handler"], 1: ["root/handler"]}


def _growth(count: int, *, hook: TraceHook | None = None) -> int:
    """Memory blocks held after ``count`` children came and went, beyond 10,000's.

    Each child has a name of its own, as connections often do. Blocks are
    counted by the interpreter's allocator (`sys.getallocatedblocks`), which
    costs nothing while the children run.
    """

    async def main() -> None:
        if hook is not None:
            add_trace_hook(hook)
        async with open_bundle(name="server") as server:
            baseline = 0
            for index in range(count):
                server.start_soon(trio.lowlevel.checkpoint, name=f"conn-{index}")
                if index % 1000 == 999:
                    await trio.testing.wait_all_tasks_blocked()
                if index == 9_999:
                    gc.collect()
                    baseline = sys.getallocatedblocks()
            await trio.testing.wait_all_tasks_blocked()
            gc.collect()
            result.append(sys.getallocatedblocks() - baseline)
        if hook is not None:
            remove_trace_hook(hook)

    result: list[int] = []
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return result[0]


def test_memory_stays_flat_over_children_that_came_and_went():
    # A leak of one small object per child would be 90,000 blocks.
    assert _growth(100_000) < 1_000


def test_memory_stays_flat_while_tracing_too():
    paths: set[str] = set()

    def keep_paths_of_the_first(event: TraceEvent) -> None:
        if len(paths) < 10 and event.task is not None:
            paths.add(event.task)

    assert _growth(30_000, hook=keep_paths_of_the_first) < 1_000
    assert len(paths) == 10
    assert all(re.fullmatch(r"server/conn-\d+", path) for path in paths)


# -- the default grace ----------------------------------------------------------------


@pytest.mark.parametrize("method", ["cancel", "shutdown"])
async def test_grace_defaults_to_ten_seconds(autojump_clock, method):
    t0 = trio.current_time()
    async with open_bundle() as bundle:
        bundle.start_soon(trio.sleep_forever)
        report = await getattr(bundle, method)()
    assert report.hard_deadline == t0 + 10
    assert report.hard_cancelled_at == t0 + 10
    assert trio.current_time() - t0 == 10


# -- who may call cancel() ---------------------------------------------------------


@pytest.mark.parametrize("grace", [1, math.inf])
async def test_cancel_from_a_child_still_starting_is_refused(autojump_clock, grace):
    errors: list[str] = []

    async def starting(*, task_status=trio.TASK_STATUS_IGNORED):
        try:
            await bundle.cancel(grace)
        except RuntimeError as exc:
            errors.append(str(exc))
        task_status.started()

    t0 = trio.current_time()
    async with open_bundle(name="b") as bundle:
        await bundle.start(starting)
    assert trio.current_time() == t0
    assert len(errors) == 1
    assert "runs inside bundle 'b' and would wait for itself" in errors[0]


async def test_current_bundle_is_the_bundle_a_task_belongs_to(autojump_clock):
    seen: dict[str, str] = {}

    async def child(*, task_status=trio.TASK_STATUS_IGNORED):
        seen["starting"] = current_bundle().name
        task_status.started()
        seen["child"] = current_bundle().name
        async with trio.open_nursery() as plain:
            plain.start_soon(grandchild)

    async def grandchild():
        seen["grandchild"] = current_bundle().name

    async with open_bundle(name="outer") as outer:
        seen["body"] = current_bundle().name
        async with open_bundle(name="inner") as inner:
            seen["nested body"] = current_bundle().name
            await inner.start(child)
        outer.start_soon(child)
    assert seen == {
        "body": "outer",
        "nested body": "inner",
        "starting": "outer",
        "child": "outer",
        "grandchild": "outer",
    }
    with pytest.raises(RuntimeError, match=r"runs in no bundle; pass the bundle"):
        current_bundle()


# -- exceptions as a plain nursery has them -------------------------------------


async def _child_fails_then_body_fails(open_thing):
    async def boom():
        await trio.sleep(1)
        raise ValueError("child, first")

    async with open_thing() as n:
        n.start_soon(boom)
        try:
            await trio.sleep_forever()
        finally:
            raise OSError("body, second")


async def _body_fails_then_child_fails(open_thing):
    async def late():
        try:
            await trio.sleep_forever()
        finally:
            raise KeyError("child, second")

    async with open_thing() as n:
        n.start_soon(late)
        await trio.sleep(1)
        raise OSError("body, first")


@pytest.mark.parametrize(
    "scenario", [_child_fails_then_body_fails, _body_fails_then_child_fails]
)
async def test_exceptions_are_in_the_order_a_nursery_gives(autojump_clock, scenario):
    expected = await capture(lambda: scenario(trio.open_nursery))
    got = await capture(lambda: scenario(open_bundle))
    assert isinstance(expected, BaseExceptionGroup)
    assert isinstance(got, BaseExceptionGroup)
    assert [str(e) for e in got.exceptions] == [str(e) for e in expected.exceptions]
    assert shape(got) == shape(expected)


async def test_wrong_arguments_raise_in_the_caller_at_once(autojump_clock):
    async def worker(a: int, b: int) -> None:
        await trio.sleep(a + b)

    async with open_bundle() as bundle:
        bundle.start_soon(trio.sleep, 1, name="sibling")
        with pytest.raises(TypeError, match="missing 1 required positional"):
            bundle.start_soon(worker, 1)  # type: ignore[call-arg]
        await trio.sleep(2)  # the body and the sibling go on
    assert bundle.statistics().children_running == 0


async def test_bad_arguments_of_bundle_methods(autojump_clock):
    async def coro_fn() -> None:
        pass

    async with open_bundle() as bundle:
        with pytest.raises(TypeError, match=r"^callback must be callable, not 5$"):
            bundle.on_stop(5)  # type: ignore[arg-type]
        with pytest.raises(
            TypeError, match=r"^start\(\): async_fn must be an async function"
        ):
            await bundle.start(5)  # type: ignore[arg-type]
        coro = coro_fn()
        with pytest.raises(
            TypeError, match=r"^start\(\): async_fn must be an async function"
        ):
            await bundle.start(coro)  # type: ignore[arg-type]
        assert coro.cr_frame is None  # closed, so it will not warn
        assert bundle.statistics().children_running == 0


# -- what the trace and the report say ------------------------------------------


async def test_started_from_another_task_traces_the_child(autojump_clock):
    async def child(*, task_status=trio.TASK_STATUS_IGNORED):
        async with trio.open_nursery() as helpers:
            helpers.start_soon(lambda: _started_later(task_status), name="helper")
        await trio.sleep(1)

    async def _started_later(task_status) -> None:
        await trio.sleep(1)
        task_status.started()

    with record_trace() as trace:
        async with open_bundle(name="b") as bundle:
            await bundle.start(child, name="child")
    started = trace.of_kind(TraceKind.CHILD_STARTED)
    ended = trace.of_kind(TraceKind.CHILD_ENDED)
    assert [(e.time - started[0].time, e.task) for e in started + ended] == [
        (0, "b/child"),
        (1, "b/child"),
    ]


@pytest.mark.parametrize("by", ["cancel_scope", "enclosing scope"])
async def test_report_says_when_an_outside_cancel_hard_cancelled(autojump_clock, by):
    t0 = trio.current_time()
    reports = []

    async def cancel_and_report(bundle):
        reports.append(await bundle.cancel(grace=10))

    async with trio.open_nursery() as nursery:
        with trio.CancelScope() as enclosing:
            async with open_bundle() as bundle:
                bundle.start_soon(trio.sleep_forever)
                nursery.start_soon(cancel_and_report, bundle)
                await trio.sleep(3)
                if by == "cancel_scope":
                    bundle.cancel_scope.cancel()
                else:
                    enclosing.cancel()
                await trio.sleep_forever()
    (report,) = reports
    assert report.count(ChildOutcome.CANCELLED) == 1
    assert report.hard_cancelled_at == t0 + 3


async def test_children_that_got_stop_are_reported_finished(autojump_clock):
    # Shutdown begins before any of the children has run.
    async def worker(inbox):
        async for _ in inbox:
            pass

    async with open_bundle() as bundle:
        for _ in range(10_000):
            _, inbox = bundle.open_inbox()
            bundle.start_soon(worker, inbox)
        report = await bundle.shutdown(grace=1)
    assert report.count(ChildOutcome.FINISHED) == 10_000
    assert report.hard_cancelled_at is None
    assert report.graceful


# -- entering a bundle ---------------------------------------------------------------


@trio.lowlevel.enable_ki_protection
def _make_keyboard_interrupt_pending() -> None:
    # In protected code Trio does not raise at once: it makes the interrupt
    # pending, for the main task's next checkpoint.
    signal.raise_signal(signal.SIGINT)


def test_keyboard_interrupt_while_entering_arrives_in_the_body():
    ran: list[str] = []

    async def main() -> None:
        _make_keyboard_interrupt_pending()
        async with open_bundle() as bundle:
            ran.append("body")
            bundle.start_soon(trio.sleep_forever)
            try:
                await trio.lowlevel.checkpoint()
            finally:
                ran.append("interrupted in the body")

    with pytest.raises(BaseExceptionGroup) as caught:
        trio.run(main)
    # raised in the body, and out of the bundle as out of a plain nursery
    assert shape(caught.value) == (
        "BaseExceptionGroup",
        "Exceptions from Trio nursery",
        ["KeyboardInterrupt"],
    )
    assert ran == ["body", "interrupted in the body"]


async def test_a_grace_beyond_any_float_waits_for_ever(autojump_clock):
    async with open_bundle() as bundle:
        bundle.start_soon(trio.sleep, 1000)
        report = await bundle.cancel(grace=10**400)
    assert report.hard_deadline == math.inf
    assert report.graceful


async def test_a_nested_bundle_that_abandons_work_logs_at_info(autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="trio_graceful")

    async def leaves_a_thread_behind():
        try:
            await trio.sleep_forever()
        finally:
            inner.note_abandoned("thread 'blocked'")

    async def child():
        nonlocal inner
        async with open_bundle(name="inner") as inner:
            inner.start_soon(leaves_a_thread_behind)
            await inner.cancel(grace=1)

    inner = None
    async with open_bundle(name="root") as root:
        root.start_soon(child, name="worker")
    (record,) = caplog.records
    assert record.levelno == logging.INFO
    assert record.getMessage() == (
        "bundle 'root/worker/inner': 0 finished, 1 hard-cancelled, 0 raised, "
        "1 abandoned, in 1.000 s"
    )


async def test_a_bundle_inbox_can_stop_first_and_hand_back_the_queue(autojump_clock):
    handed_back: list[object] = []

    async def worker(inbox):
        async for _ in inbox:
            await trio.sleep(1)
        handed_back.extend(inbox.drain_nowait())

    t0 = trio.current_time()
    async with open_bundle() as bundle:
        sender, inbox = bundle.open_inbox(10, stop_first=True)
        for job in range(5):
            sender.send_nowait(job)
        bundle.start_soon(worker, inbox)
        await trio.sleep(0.5)  # job 0 is being worked on
        report = await bundle.shutdown(grace=10)
    assert report.graceful
    assert trio.current_time() - t0 == 1
    assert handed_back == [1, 2, 3, 4]
