"""run_asyncio: asyncio coroutines as bundle children, through trio-asyncio.

trio-asyncio runs asyncio's timers on Trio's clock, so under the
``autojump_clock`` fixture ``asyncio.sleep`` is virtual too and every
timeline below is exact.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import sys
from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from tests.support.asyncio_bridge import trio_asyncio
from tests.support.exception_shapes import capture, only_child_error
from trio_graceful import (
    STOP,
    AsyncioInbox,
    ChildOutcome,
    open_bundle,
    run_asyncio,
)

# -- results, errors, time -------------------------------------------------------


async def test_result_and_arguments_and_virtual_time(autojump_clock):
    async def add_later(inbox: AsyncioInbox[object], a: int, b: int) -> int:
        await asyncio.sleep(5)
        return a + b

    results: list[int] = []
    async with trio_asyncio.open_loop():
        t0 = trio.current_time()
        async with open_bundle() as bundle:

            async def child() -> None:
                results.append(await run_asyncio(add_later, 2, 3))

            bundle.start_soon(child)
        assert trio.current_time() - t0 == 5
    assert results == [5]


async def test_exception_surfaces_like_a_trio_childs(autojump_clock):
    async def broken(inbox: AsyncioInbox[object]) -> None:
        await asyncio.sleep(1)
        raise ValueError("bad frame")

    async def body() -> None:
        async with open_bundle() as bundle:
            bundle.start_soon(run_asyncio, broken)

    async with trio_asyncio.open_loop():
        got = await capture(body)
    assert str(only_child_error(got, ValueError)) == "bad frame"


async def test_started_from_asyncio_code(autojump_clock):
    async def server(inbox: AsyncioInbox[object], *, task_status) -> str:
        await asyncio.sleep(1)
        task_status.started(8080)
        assert await inbox.receive() is STOP
        return "closed"

    async with trio_asyncio.open_loop():
        t0 = trio.current_time()
        async with open_bundle() as bundle:
            port = await bundle.start(run_asyncio, server)
            assert (port, trio.current_time() - t0) == (8080, 1)
            report = await bundle.shutdown(grace=5)
    assert report.graceful


# -- STOP, read from asyncio --------------------------------------------------


async def test_asyncio_code_reads_its_inbox_up_to_stop(autojump_clock):
    got: list[object] = []

    async def consumer(inbox: AsyncioInbox[str]) -> None:
        async for message in inbox:
            got.append(message)
            await asyncio.sleep(1)
        got.append(("stop received", inbox.stop_received))
        await asyncio.sleep(2)  # flushing, within the grace

    async with trio_asyncio.open_loop(), open_bundle(name="aio") as bundle:
        send, inbox = bundle.open_inbox(10)
        for message in ("a", "b"):
            send.send_nowait(message)
        bundle.start_soon(
            functools.partial(run_asyncio, inbox=inbox),
            consumer,
            name="consumer",
        )
        await trio.testing.wait_all_tasks_blocked()
        t0 = trio.current_time()
        report = await bundle.shutdown(grace=10)
    assert got == ["a", "b", ("stop received", True)]
    # At the shutdown "a" was being handled: 1 s more for it, 1 s for "b"
    # (queued before STOP), then 2 s of flushing.
    assert [(c.name, c.outcome, c.elapsed) for c in report.children] == [
        ("consumer", ChildOutcome.FINISHED, 4)
    ]
    assert report.started_at == t0


async def test_end_of_channel_ends_the_iteration_too(autojump_clock):
    got: list[object] = []

    async def consumer(inbox: AsyncioInbox[int]) -> None:
        got.extend([message async for message in inbox])
        got.append(inbox.stop_received)

    async with trio_asyncio.open_loop(), open_bundle() as bundle:
        send, inbox = bundle.open_inbox(1)
        bundle.start_soon(functools.partial(run_asyncio, inbox=inbox), consumer)
        await send.send(1)
        await send.aclose()
    assert got == [1, False]


async def test_default_inbox_only_carries_stop(autojump_clock):
    got: list[object] = []

    async def idle(inbox: AsyncioInbox[object]) -> None:
        got.append(await inbox.receive())

    async with trio_asyncio.open_loop(), open_bundle() as bundle:
        bundle.start_soon(run_asyncio, idle)
        await trio.testing.wait_all_tasks_blocked()
        assert bundle.statistics().inboxes == 1
        report = await bundle.shutdown(grace=1)
        assert bundle.statistics().inboxes == 0
    assert got == [STOP]
    assert report.graceful


async def test_until_stop_waits_on_an_asyncio_source(autojump_clock):
    got: list[object] = []

    async def worker(inbox: AsyncioInbox[object], queue: asyncio.Queue[str]) -> None:
        while True:
            item = await inbox.until_stop(queue.get)
            got.append((trio.current_time(), item))
            if item is STOP:
                return

    async def producer(queue: asyncio.Queue[str]) -> None:
        await asyncio.sleep(1)
        await queue.put("job-1")
        await asyncio.sleep(1)
        await queue.put("job-2")

    async with trio_asyncio.open_loop():
        queue: asyncio.Queue[str] = asyncio.Queue()
        t0 = trio.current_time()
        async with open_bundle() as bundle:
            bundle.start_soon(run_asyncio, worker, queue)
            await trio_asyncio.aio_as_trio(producer)(queue)
            await trio.sleep(3)
            await bundle.shutdown(grace=10)
    assert got == [(t0 + 1, "job-1"), (t0 + 2, "job-2"), (t0 + 5, STOP)]
    assert queue.empty()


async def test_receive_is_cancel_safe_from_asyncio(autojump_clock):
    got: list[object] = []

    async def impatient(inbox: AsyncioInbox[str]) -> None:
        try:
            await asyncio.wait_for(inbox.receive(), timeout=1)
        except asyncio.TimeoutError:
            got.append("timed out")
        got.append(await inbox.receive())  # nothing was lost meanwhile

    async with trio_asyncio.open_loop(), open_bundle() as bundle:
        send, inbox = bundle.open_inbox(1)
        bundle.start_soon(functools.partial(run_asyncio, inbox=inbox), impatient)
        await trio.sleep(2)
        await send.send("late")
    assert got == ["timed out", "late"]


# -- hard cancel ----------------------------------------------------------------


async def run_and_record(
    caught: list[BaseException],
    aio_fn: Callable[[AsyncioInbox[object]], Awaitable[object]],
) -> None:
    """A child that runs ``aio_fn`` and records what ended it."""
    try:
        await run_asyncio(aio_fn)
    except BaseException as exc:
        caught.append(exc)
        raise


async def test_hard_cancel_cancels_the_task_and_it_unwinds(autojump_clock):
    seen: list[object] = []
    caught: list[BaseException] = []

    async def busy(inbox: AsyncioInbox[object]) -> None:
        try:
            await asyncio.sleep(3600)
        except BaseException as exc:
            seen.append(type(exc))
            raise
        finally:
            seen.append("finally")

    child = functools.partial(run_and_record, caught, busy)

    async with trio_asyncio.open_loop():
        t0 = trio.current_time()
        async with open_bundle() as bundle:
            bundle.start_soon(child, name="busy")
            report = await bundle.cancel(grace=10)
        assert trio.current_time() - t0 == 10
    # asyncio code sees asyncio's exception; the Trio side, a plain Cancelled.
    assert seen == [asyncio.CancelledError, "finally"]
    assert [type(exc) for exc in caught] == [trio.Cancelled]
    assert [(c.name, c.outcome, c.elapsed) for c in report.children] == [
        ("busy", ChildOutcome.CANCELLED, 10)
    ]


async def test_task_that_swallows_cancelled_error_is_still_bounded(autojump_clock):
    seen: list[object] = []

    async def stubborn(inbox: AsyncioInbox[object]) -> None:
        for _ in range(3):
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                seen.append(("swallowed", trio.current_time()))

    async with trio_asyncio.open_loop():
        t0 = trio.current_time()
        async with open_bundle() as bundle:
            bundle.start_soon(run_asyncio, stubborn, name="stubborn")
            report = await bundle.shutdown(grace=10)  # it never reads STOP
        assert trio.current_time() - t0 == 10
    # Each wait after the deadline is cancelled at once, so the loop ends.
    assert seen == [("swallowed", t0 + 10)] * 3
    assert report.children[0].outcome is ChildOutcome.CANCELLED
    assert report.children[0].elapsed == 10
    assert report.hard_cancelled_at == t0 + 10


@pytest.mark.parametrize("wait", ["sleep(1)", "sleep(0)"])
async def test_task_that_swallows_cancelled_error_for_ever_is_abandoned(
    autojump_clock, caplog, wait
):
    done = asyncio.Event()
    swallowed: list[float] = []

    async def stubborn(inbox: AsyncioInbox[object]) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed.append(trio.current_time())
        while not done.is_set():
            try:
                # sleep(0) yields nothing that can be cancelled: the refusal
                # is thrown in at once, without a turn of the loop.
                await (asyncio.sleep(1) if wait == "sleep(1)" else asyncio.sleep(0))
            except asyncio.CancelledError:
                swallowed.append(trio.current_time())
        raise ValueError("discarded, as an abandoned thread's exception is")

    caught: list[BaseException] = []
    child = functools.partial(run_and_record, caught, stubborn)

    async with trio_asyncio.open_loop():
        t0 = trio.current_time()
        async with open_bundle(name="aio") as bundle:
            bundle.start_soon(child, name="stubborn")
            await trio.sleep(5)
            report = await bundle.shutdown(grace=1)
        # The bundle's bound held, to the exact virtual instant.
        assert trio.current_time() - t0 == 6
        assert [type(exc) for exc in caught] == [trio.Cancelled]
        assert report.hard_cancelled_at == t0 + 6
        assert [
            (c.name, c.outcome, c.elapsed, c.abandoned) for c in report.children
        ] == [("stubborn", ChildOutcome.CANCELLED, 1, ("asyncio task 'stubborn'",))]
        assert report.abandoned == ("asyncio task 'stubborn'",)
        # The cancellation and then each refused wait was swallowed, all at
        # the deadline; abandoned, the task waits unrefused again.
        assert swallowed == [t0 + 6] * 101
        if wait == "sleep(1)":
            await trio.sleep(3)
            assert swallowed == [t0 + 6] * 101
        done.set()
        await trio.testing.wait_all_tasks_blocked()
    # The loop closed, so the abandoned task ended: nothing was left behind,
    # and its exception was retrieved, so asyncio does not log it.
    gc.collect()
    assert [r.getMessage() for r in caplog.records] == []


async def test_cleanup_waits_after_a_hard_cancel_are_cancelled_too(autojump_clock):
    seen: list[object] = []

    async def slow_cleanup(inbox: AsyncioInbox[object]) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0)  # cancelled as well
            seen.append("not reached")  # pragma: no cover

    async def careful_cleanup(inbox: AsyncioInbox[object]) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                seen.append(("cleanup cut short", trio.current_time()))

    async with trio_asyncio.open_loop():
        t0 = trio.current_time()
        async with open_bundle() as bundle:
            bundle.start_soon(run_asyncio, slow_cleanup)
            bundle.start_soon(run_asyncio, careful_cleanup)
            report = await bundle.cancel(grace=4)
    assert seen == [("cleanup cut short", t0 + 4)]
    assert [c.elapsed for c in report.children] == [4, 4]


async def test_task_that_swallows_and_returns_counts_as_cancelled(autojump_clock):
    results: list[str] = []

    async def stubborn(inbox: AsyncioInbox[object]) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            return "swallowed"
        return "slept"  # pragma: no cover

    async def child() -> None:
        results.append(await run_asyncio(stubborn))

    async with trio_asyncio.open_loop(), open_bundle() as bundle:
        bundle.start_soon(child)
        report = await bundle.cancel(grace=1)
    # Like a Trio child that swallows Cancelled: it returns, and the report
    # says it was hard-cancelled.
    assert results == ["swallowed"]
    assert report.children[0].outcome is ChildOutcome.CANCELLED


async def test_cancelled_before_the_task_ran_never_calls_the_function(autojump_clock):
    calls: list[str] = []

    async def never(inbox: AsyncioInbox[object]) -> None:
        calls.append("called")  # pragma: no cover

    async with trio_asyncio.open_loop(), open_bundle() as bundle:

        async def child() -> None:
            with trio.CancelScope() as scope:
                scope.cancel()
                await run_asyncio(never)
            assert scope.cancelled_caught

        bundle.start_soon(child)
    assert calls == []


# -- misuse ---------------------------------------------------------------------


async def noop(inbox: AsyncioInbox[object]) -> None:
    pass  # pragma: no cover - never called


async def test_the_bundle_defaults_to_the_callers_own(autojump_clock):
    got: list[object] = []

    async def idle(inbox: AsyncioInbox[object]) -> None:
        got.append(await inbox.receive())

    async def child() -> None:
        async with open_bundle(name="inner") as inner:
            inner.start_soon(run_asyncio, idle)
            await trio.testing.wait_all_tasks_blocked()
            assert (inner.statistics().inboxes, outer.statistics().inboxes) == (1, 0)
            await inner.shutdown(grace=1)

    async with trio_asyncio.open_loop(), open_bundle(name="outer") as outer:
        outer.start_soon(child)
    assert got == [STOP]


async def test_bundle_may_be_given_explicitly(autojump_clock):
    got: list[object] = []

    async def idle(inbox: AsyncioInbox[object]) -> None:
        got.append(await inbox.receive())

    async def child() -> None:
        await run_asyncio(idle, bundle=bundle)

    async with trio_asyncio.open_loop(), open_bundle() as bundle:
        bundle.start_soon(child)
        await trio.testing.wait_all_tasks_blocked()
        await bundle.shutdown(grace=1)
    assert got == [STOP]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bundle": 5}, r"^bundle must be a Bundle or None, not 5$"),
        ({"inbox": "inbox"}, r"^inbox must be an InboxReceiver or None, not 'inbox'$"),
        ({"aio_fn": 5}, r"^aio_fn must be an async function, not 5$"),
    ],
)
async def test_bad_arguments_raise_before_anything_starts(kwargs, message):
    calls: list[str] = []

    async def counted(inbox: AsyncioInbox[object]) -> None:
        calls.append("called")  # pragma: no cover - must not run

    async with trio_asyncio.open_loop(), open_bundle() as bundle:

        async def child() -> None:
            options = dict(kwargs)
            fn = options.pop("aio_fn", counted)
            with pytest.raises(TypeError, match=message):
                await run_asyncio(fn, **options)

        bundle.start_soon(child)
        await trio.testing.wait_all_tasks_blocked()
        assert bundle.statistics().inboxes == 0
    assert calls == []


async def test_needs_a_trio_asyncio_loop():
    async with open_bundle() as bundle:

        async def child() -> None:
            with pytest.raises(
                RuntimeError,
                match=(
                    r"^run_asyncio\(\) needs a running trio-asyncio loop: open one "
                    r"around the bundle with 'async with trio_asyncio.open_loop\(\):'$"
                ),
            ):
                await run_asyncio(noop)

        bundle.start_soon(child)


async def test_needs_trio_asyncio_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "trio_asyncio", None)
    async with open_bundle() as bundle:

        async def child() -> None:
            with pytest.raises(
                ModuleNotFoundError,
                match=(
                    r"^running asyncio code in a bundle needs trio-asyncio; install "
                    r"it with the 'asyncio' extra: pip install "
                    r"'trio-graceful\[asyncio\]'$"
                ),
            ):
                await run_asyncio(noop)

        bundle.start_soon(child)


async def test_until_stop_refuses_what_is_not_callable(autojump_clock):
    errors: list[BaseException] = []

    async def worker(inbox: AsyncioInbox[object]) -> None:
        try:
            await inbox.until_stop(5)  # type: ignore[arg-type]
        except TypeError as exc:
            errors.append(exc)

    async with trio_asyncio.open_loop(), open_bundle() as bundle:
        bundle.start_soon(run_asyncio, worker)
    assert [str(exc) for exc in errors] == ["aio_fn must be an async function, not 5"]


async def test_not_a_coroutine_function():
    def sync(inbox: AsyncioInbox[object]) -> int:
        return 1

    async with trio_asyncio.open_loop(), open_bundle() as bundle:

        async def child() -> None:
            with pytest.raises(
                TypeError,
                match=(
                    r"^run_asyncio expected an asyncio coroutine function, but "
                    r"<function .*sync at 0x[0-9a-f]+> returned 1$"
                ),
            ):
                await run_asyncio(sync)  # type: ignore[arg-type]

        bundle.start_soon(child)


async def test_asyncio_inbox_repr_and_no_public_constructor():
    reprs: list[str] = []

    async def look(inbox: AsyncioInbox[object]) -> None:
        reprs.append(repr(inbox))

    async with trio_asyncio.open_loop(), open_bundle() as bundle:
        _, inbox = bundle.open_inbox()
        bundle.start_soon(functools.partial(run_asyncio, inbox=inbox), look)
    assert reprs == [f"<trio_graceful.AsyncioInbox for {inbox!r}>"]
    with pytest.raises(
        TypeError, match=r"^trio_graceful.AsyncioInbox has no public constructor$"
    ):
        AsyncioInbox(inbox)  # type: ignore[call-arg]
