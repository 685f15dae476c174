"""run_in_thread: the stop flag, abandonment at the hard cancel, the budget.

Virtual time only moves when a test moves it: with the ``mock_clock``
fixture nothing advances by itself, so a thread that finishes "at once" does
so at exactly the same Trio time, whatever the real threads take. Tests that
need the deadline to pass either jump the clock or switch autojump on once
the remaining threads are blocked for good.
"""

from __future__ import annotations

import functools
import math
import re
import threading

import pytest
import trio
import trio.testing

from tests.support.exception_shapes import capture, only_child_error
from trio_graceful import (
    STOP,
    ChildOutcome,
    StopFlag,
    ThreadBudget,
    ThreadBudgetStatistics,
    open_bundle,
    run_in_thread,
)


def reached(event: trio.Event) -> None:
    """From a thread: tell the Trio side that the thread got this far."""
    trio.from_thread.run_sync(event.set)


async def wait_threads_released(budget: ThreadBudget) -> None:
    """Wait until every thread of ``budget`` has ended and given its token back.

    An abandoned thread reports back through a callback that it queues on the
    Trio run as it returns, at a moment of its own: look after every
    scheduling round (virtual time does not move meanwhile).
    """
    while budget.statistics().threads_running:
        await trio.lowlevel.checkpoint()


# -- graceful: STOP sets the flag -----------------------------------------------


async def test_cooperative_thread_finishes_inside_the_grace(mock_clock):
    running = trio.Event()
    seen: list[object] = []
    results: list[str] = []

    def copy_files(flag: StopFlag, names: list[str]) -> str:
        reached(running)
        copied = 0
        while not flag.wait(timeout=30):  # a real-time bound, never reached
            pass
        # STOP: finish the file being copied, then return.
        copied += 1
        seen.append(flag.is_set())
        return f"copied {copied} of {len(names)}"

    async def child() -> None:
        results.append(await run_in_thread(copy_files, ["a", "b"]))

    t0 = trio.current_time()
    async with open_bundle(name="files") as bundle:
        bundle.start_soon(child, name="copier")
        await running.wait()
        report = await bundle.shutdown(grace=10)
    assert results == ["copied 1 of 2"]
    assert seen == [True]
    assert report.graceful
    assert report.abandoned == ()
    assert [(c.name, c.outcome, c.elapsed) for c in report.children] == [
        ("copier", ChildOutcome.FINISHED, 0)
    ]
    assert trio.current_time() == t0


async def test_flag_is_clear_until_stop_reaches_the_child(mock_clock):
    running = trio.Event()
    release = threading.Event()
    before: list[bool] = []

    def work(flag: StopFlag) -> None:
        before.append(flag.is_set())
        reached(running)
        release.wait()
        before.append(flag.is_set())

    async with open_bundle() as bundle:
        bundle.start_soon(run_in_thread, work)
        await running.wait()
        # The thread ends on its own, before any STOP.
        release.set()
    assert before == [False, False]


async def test_flag_is_set_at_once_for_a_thread_started_during_shutdown(mock_clock):
    flags: list[bool] = []

    def look(flag: StopFlag) -> None:
        flags.append(flag.is_set())

    async def dispatcher() -> None:
        _, inbox = bundle.open_inbox()
        assert await inbox.receive() is STOP
        # Work handed to a thread after the shutdown began is told at once.
        bundle.start_soon(run_in_thread, look)

    async with open_bundle() as bundle:
        bundle.start_soon(dispatcher)
        await trio.testing.wait_all_tasks_blocked()
        report = await bundle.shutdown(grace=5)
    assert flags == [True]
    assert report.count(ChildOutcome.FINISHED) == 2


async def test_flag_repr_and_wait_timeout():
    flags: list[StopFlag] = []

    def keep(flag: StopFlag) -> bool:
        flags.append(flag)
        return flag.wait(timeout=0.001)

    async with open_bundle() as bundle:

        async def child() -> None:
            assert await run_in_thread(keep) is False

        bundle.start_soon(child)
    (flag,) = flags
    assert repr(flag) == f"<trio_graceful.StopFlag clear at {id(flag):#x}>"
    with pytest.raises(
        TypeError, match=r"^trio_graceful.StopFlag has no public constructor$"
    ):
        StopFlag(threading.Event())  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("timeout", "error", "message"),
    [
        ("1", TypeError, r"^timeout must be a number of seconds, not str '1'$"),
        (True, TypeError, r"^timeout must be a number of seconds, not bool True$"),
        (-1, ValueError, r"^timeout must be >= 0, not -1$"),
        (math.nan, ValueError, r"^timeout must be >= 0, not nan$"),
    ],
)
async def test_flag_wait_refuses_bad_timeouts(timeout, error, message):
    errors: list[BaseException] = []

    def wait_badly(flag: StopFlag) -> None:
        try:
            flag.wait(timeout)
        except Exception as exc:
            errors.append(exc)

    async with open_bundle() as bundle:
        bundle.start_soon(run_in_thread, wait_badly)
    (exc,) = errors
    assert isinstance(exc, error)
    assert re.fullmatch(message.strip("^$"), str(exc))


@pytest.mark.parametrize("timeout", [math.inf, 1e300])
async def test_flag_wait_with_an_endless_timeout_waits_for_stop(mock_clock, timeout):
    waiting = trio.Event()
    results: list[bool] = []

    def wait_long(flag: StopFlag) -> None:
        reached(waiting)
        results.append(flag.wait(timeout))

    async with open_bundle() as bundle:
        bundle.start_soon(run_in_thread, wait_long)
        await waiting.wait()
        await bundle.shutdown(grace=10)
    assert results == [True]


# -- hard: abandoned at the deadline, and reported ------------------------------


async def test_thread_that_ignores_the_flag_is_abandoned_at_the_deadline(mock_clock):
    running = trio.Event()
    release = threading.Event()
    flag_when_released: list[bool] = []
    budget = ThreadBudget(4)

    def stubborn(flag: StopFlag) -> str:
        reached(running)
        release.wait()  # deaf to the flag
        flag_when_released.append(flag.is_set())
        return "too late"

    t0 = trio.current_time()
    async with open_bundle(name="svc") as bundle:
        bundle.start_soon(
            functools.partial(run_in_thread, name="stubborn", budget=budget),
            stubborn,
            name="blocking-call",
        )
        await running.wait()
        # Only the thread is left, blocked until released: let time fly.
        mock_clock.autojump_threshold = 0
        report = await bundle.shutdown(grace=5)
        assert trio.current_time() - t0 == 5
    assert report.hard_cancelled_at == t0 + 5
    assert [(c.name, c.outcome, c.elapsed, c.abandoned) for c in report.children] == [
        ("blocking-call", ChildOutcome.CANCELLED, 5, ("thread 'stubborn'",))
    ]
    assert report.abandoned == ("thread 'stubborn'",)
    assert report.summary() == (
        "bundle 'svc': 0 finished, 1 hard-cancelled, 0 raised, 1 abandoned, in 5.000 s"
    )
    # The thread still runs and still holds its token.
    assert budget.statistics() == ThreadBudgetStatistics(
        total_tokens=4,
        threads_running=1,
        peak_threads_running=1,
        threads_abandoned=1,
        threads_abandoned_total=1,
        tasks_waiting=0,
    )
    release.set()
    await wait_threads_released(budget)
    assert flag_when_released == [True]
    assert budget.statistics() == ThreadBudgetStatistics(
        total_tokens=4,
        threads_running=0,
        peak_threads_running=1,
        threads_abandoned=0,
        threads_abandoned_total=1,
        tasks_waiting=0,
    )


async def test_hard_cancel_without_stop_sets_the_flag_when_abandoning(mock_clock):
    running = trio.Event()
    release = threading.Event()
    flag_states: list[bool] = []

    budget = ThreadBudget(1)

    def stubborn(flag: StopFlag) -> None:
        reached(running)
        release.wait()
        flag_states.append(flag.is_set())

    async with open_bundle() as bundle:
        bundle.start_soon(functools.partial(run_in_thread, budget=budget), stubborn)
        await running.wait()
        mock_clock.autojump_threshold = 0
        report = await bundle.cancel(grace=3)  # no STOP: just a deadline
    release.set()
    await wait_threads_released(budget)
    assert flag_states == [True]
    assert report.children[0].abandoned == (
        f"thread 'stubborn from {report.children[0].name}'",
    )


async def test_abandoned_thread_sees_check_cancelled_raise(mock_clock):
    running = trio.Event()
    release = threading.Event()
    in_thread: list[str] = []

    def stubborn(flag: StopFlag) -> None:
        reached(running)
        release.wait()
        try:
            trio.from_thread.check_cancelled()
        except trio.Cancelled:
            in_thread.append("abandoned")

    budget = ThreadBudget(1)
    async with open_bundle() as bundle:
        bundle.start_soon(functools.partial(run_in_thread, budget=budget), stubborn)
        await running.wait()
        mock_clock.autojump_threshold = 0
        await bundle.cancel(grace=1)
    release.set()
    await wait_threads_released(budget)
    assert in_thread == ["abandoned"]


async def test_cancelled_while_waiting_for_a_token_abandons_nothing(mock_clock):
    running = trio.Event()
    release = threading.Event()
    calls: list[str] = []
    budget = ThreadBudget(1)

    def stubborn(flag: StopFlag) -> None:
        calls.append("stubborn")
        reached(running)
        release.wait()

    def never(flag: StopFlag) -> None:
        calls.append("never")  # pragma: no cover - must not run

    async with open_bundle() as bundle:
        bundle.start_soon(
            functools.partial(run_in_thread, budget=budget),
            stubborn,
            name="holder",
        )
        await running.wait()
        bundle.start_soon(
            functools.partial(run_in_thread, budget=budget),
            never,
            name="queued",
        )
        await trio.testing.wait_all_tasks_blocked()
        assert budget.statistics().tasks_waiting == 1
        mock_clock.autojump_threshold = 0
        report = await bundle.cancel(grace=2)
    assert sorted((c.name, c.outcome, c.abandoned) for c in report.children) == [
        ("holder", ChildOutcome.CANCELLED, ("thread 'stubborn from holder'",)),
        ("queued", ChildOutcome.CANCELLED, ()),
    ]
    assert budget.statistics().tasks_waiting == 0
    release.set()
    await wait_threads_released(budget)
    assert calls == ["stubborn"]


async def test_a_caller_cancelled_from_outside_sees_a_plain_cancelled(mock_clock):
    running = trio.Event()
    release = threading.Event()
    caught: list[BaseException] = []

    def stubborn(flag: StopFlag) -> None:
        reached(running)
        release.wait()

    budget = ThreadBudget(1)

    async def child() -> None:
        try:
            await run_in_thread(stubborn, budget=budget)
        except BaseException as exc:
            caught.append(exc)
            raise

    async with open_bundle() as bundle:
        bundle.start_soon(child)
        await running.wait()
        bundle.cancel_scope.cancel()
    release.set()
    await wait_threads_released(budget)
    assert [type(exc) for exc in caught] == [trio.Cancelled]


# -- results and errors ---------------------------------------------------------


async def test_result_and_arguments_pass_through():
    results: list[int] = []

    def add(flag: StopFlag, a: int, b: int) -> int:
        return a + b

    async def child() -> None:
        results.append(await run_in_thread(add, 2, 3))

    async with open_bundle() as bundle:
        bundle.start_soon(child)
    assert results == [5]


async def test_thread_exception_fails_the_child_like_a_trio_exception():
    def broken(flag: StopFlag) -> None:
        raise ValueError("disk on fire")

    async def body() -> None:
        async with open_bundle() as bundle:
            bundle.start_soon(run_in_thread, broken)

    got = await capture(body)
    # Exactly what a Trio child raising ValueError produces.
    assert str(only_child_error(got, ValueError)) == "disk on fire"


async def test_thread_name_is_given_to_the_thread():
    names: list[str] = []

    def who(flag: StopFlag) -> None:
        names.append(threading.current_thread().name)

    async with open_bundle() as bundle:
        bundle.start_soon(functools.partial(run_in_thread, name="reader"), who)
        bundle.start_soon(run_in_thread, who, name="default-named")
    assert sorted(names) == ["reader", "who from default-named"]


# -- misuse and bad arguments ---------------------------------------------------


def noop(flag: StopFlag) -> None:
    pass  # pragma: no cover - never called


async def test_the_bundle_defaults_to_the_callers_own():
    flags: list[bool] = []

    def look(flag: StopFlag) -> None:
        flags.append(flag.wait(timeout=30))  # a real-time bound, never reached

    async def child() -> None:
        # A child of the inner bundle: the inner bundle's STOP reaches it.
        async with open_bundle(name="inner") as inner:
            inner.start_soon(run_in_thread, look)
            await trio.testing.wait_all_tasks_blocked()
            report = await inner.shutdown(grace=5)
        assert report.graceful
        assert outer.statistics().cancelling is False

    async with open_bundle(name="outer") as outer:
        outer.start_soon(child)
    assert flags == [True]


async def test_bundle_may_be_given_explicitly():
    results: list[str] = []

    async def child() -> None:
        results.append(await run_in_thread(lambda _flag: "ok", bundle=bundle))

    async with open_bundle() as bundle:
        bundle.start_soon(child)
    assert results == ["ok"]


async def not_sync(flag: StopFlag) -> None:
    pass  # pragma: no cover - never called


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": 3}, r"^name must be a string or None, not 3$"),
        ({"budget": 5}, r"^budget must be a ThreadBudget or None, not 5$"),
        (
            {"budget": trio.CapacityLimiter(2)},
            r"^budget must be a ThreadBudget or None, not <trio.CapacityLimiter .*>$",
        ),
        ({"gate": "g"}, r"^gate must be an AdmissionGate or None, not 'g'$"),
        ({"bundle": 5}, r"^bundle must be a Bundle or None, not 5$"),
        ({"bundle": "b"}, r"^bundle must be a Bundle or None, not 'b'$"),
        ({"sync_fn": 5}, r"^sync_fn must be a synchronous function, not 5$"),
        (
            {"sync_fn": not_sync},
            r"^sync_fn must be a synchronous function, not "
            r"<function not_sync at 0x[0-9a-f]+>$",
        ),
    ],
)
async def test_bad_arguments_raise_before_anything_starts(kwargs, message):
    async with open_bundle() as bundle:

        async def child() -> None:
            options = dict(kwargs)
            fn = options.pop("sync_fn", noop)
            with pytest.raises(TypeError, match=message):
                await run_in_thread(fn, **options)

        bundle.start_soon(child)
    assert trio.testing.active_thread_count() == 0


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (0, ValueError, r"^total_tokens must be >= 1, not 0$"),
        (-2, ValueError, r"^total_tokens must be >= 1, not -2$"),
        (1.5, TypeError, r"^total_tokens must be an int, not 1.5$"),
        (True, TypeError, r"^total_tokens must be an int, not True$"),
    ],
)
def test_bad_budget(value, error, message):
    with pytest.raises(error, match=message):
        ThreadBudget(value)


def test_budget_repr_and_tokens():
    budget = ThreadBudget(3)
    assert budget.total_tokens == 3
    assert repr(budget) == f"<trio_graceful.ThreadBudget 0/3 in use at {id(budget):#x}>"


async def test_budget_is_a_capacity_limiter_for_trio_to_thread():
    # The limiter protocol is public: plain trio threads can share the budget.
    budget = ThreadBudget(2)
    peak: list[int] = []

    def look() -> None:
        peak.append(
            trio.from_thread.run_sync(lambda: budget.statistics().threads_running)
        )

    await trio.to_thread.run_sync(look, limiter=budget)
    assert peak == [1]
    assert budget.statistics().peak_threads_running == 1
    assert budget.statistics().threads_running == 0
    with pytest.raises(
        RuntimeError,
        match=r"^this borrower isn't holding any of this CapacityLimiter's tokens$",
    ):
        budget.release_on_behalf_of("nobody")
