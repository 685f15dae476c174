"""How a run ends when something unusual ends it: SystemExit and Ctrl+C from
tasks, huge graces, overlapping runs, and arguments refused at the call.

In-process, on a MockClock, as in test_runner.py.
"""

from __future__ import annotations

import gc
import logging
import math
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

import trio_graceful
from tests.run.test_runner import Timeline, run, service_for
from trio_graceful import ExitCodes, current_runner
from trio_graceful._core._checks import check_seconds

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup


# -- SystemExit and KeyboardInterrupt ------------------------------------------------


def test_system_exit_from_a_root_task_gives_its_status_and_stops_services_in_order():
    timeline = Timeline()
    service = service_for(timeline)

    async def exiter() -> None:
        await trio.sleep(1)
        raise SystemExit(3)

    async def main() -> None:
        runner = current_runner()
        await runner.start_service(service, "db")
        await runner.start_service(service, "http")
        runner.root.start_soon(exiter)
        try:
            await trio.sleep_forever()
        finally:
            timeline("main cancelled")

    assert run(main) == 3
    assert timeline.events == [
        (1, "db ready"),
        (2, "http ready"),
        (3, "main cancelled"),
        (3, "http got STOP"),
        (3, "http stopped"),
        (3, "db got STOP"),
        (3, "db stopped"),
    ]


def test_system_exit_from_a_root_task_beside_an_error_is_a_failure():
    async def exiter() -> None:
        raise SystemExit(3)

    async def crasher() -> None:
        raise KeyError("lost")

    async def main() -> None:
        current_runner().root.start_soon(exiter)
        current_runner().root.start_soon(crasher)
        await trio.sleep_forever()

    assert run(main) == 1


def test_keyboard_interrupt_from_main_without_signals_is_bare():
    async def main() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as caught:
        run(main, signals=())
    assert type(caught.value) is KeyboardInterrupt
    # Like trio.run: nothing about our nurseries in the way.
    assert not isinstance(caught.value.__cause__, BaseExceptionGroup)


def test_keyboard_interrupt_from_a_root_task_without_signals_is_bare():
    async def interrupter() -> None:
        await trio.sleep(1)
        raise KeyboardInterrupt

    async def main() -> None:
        current_runner().root.start_soon(interrupter)
        await trio.sleep_forever()

    with pytest.raises(KeyboardInterrupt):
        run(main, signals=())


def test_ctrl_c_without_signals_is_what_trio_run_raises():
    async def main() -> None:
        signal.raise_signal(signal.SIGINT)  # Trio's own handler is in place
        await trio.sleep_forever()

    async def plain() -> None:
        signal.raise_signal(signal.SIGINT)
        await trio.sleep_forever()

    with pytest.raises(KeyboardInterrupt) as ours:
        run(main, signals=())
    with pytest.raises(KeyboardInterrupt) as trios:
        trio.run(plain, clock=trio.testing.MockClock(autojump_threshold=0))
    assert type(ours.value) is type(trios.value) is KeyboardInterrupt


# -- main must be an async function ---------------------------------------------------


def sync_main() -> None:
    called.append("called")


called: list[str] = []


def test_a_synchronous_main_is_refused_before_it_is_called():
    threads = threading.active_count()
    with pytest.raises(
        TypeError,
        match=r"^main must be an async function \(async def\), not the synchronous "
        r"<function sync_main at 0x[0-9a-f]+>$",
    ):
        trio_graceful.run(sync_main)  # type: ignore[arg-type]
    assert called == []
    assert threading.active_count() == threads


def test_a_partial_of_an_async_function_is_accepted():
    import functools

    async def main(value: int) -> None:
        seen.append(value)

    seen: list[int] = []
    assert run(functools.partial(main, 5)) == 0
    assert seen == [5]


# -- huge and infinite graces ---------------------------------------------------------


@pytest.mark.parametrize("grace", [1e10, math.inf, 10**400])
def test_huge_and_infinite_graces_work(grace):
    timeline = Timeline()

    async def main() -> None:
        _, inbox = current_runner().root.open_inbox()
        signal.raise_signal(signal.SIGTERM)
        await inbox.receive()
        await trio.sleep(5)
        timeline("drained")

    assert run(main, grace=grace, unwind_budget=grace) == 0
    assert timeline.events == [(5, "drained")]


def test_an_int_too_large_for_a_float_is_no_time_limit():
    assert check_seconds("grace", 10**400) == math.inf
    with pytest.raises(ValueError, match=r"^grace must be >= 0, not -1$"):
        check_seconds("grace", -1)


# -- arguments -------------------------------------------------------------------------


async def nothing() -> None:
    pass


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"clock": -1}, r"^clock must be a trio.abc.Clock or None, not -1$"),
        ({"clock": "mock"}, r"^clock must be a trio.abc.Clock or None, not 'mock'$"),
    ],
)
def test_a_bad_clock_is_refused_at_the_call(options, message):
    threads = threading.active_count()
    with pytest.raises(TypeError, match=message):
        trio_graceful.run(nothing, **options)
    assert threading.active_count() == threads


@pytest.mark.parametrize("signum", [-200, 0, 100_000])
def test_after_signal_refuses_what_is_not_a_signal(signum):
    with pytest.raises(
        ValueError, match=rf"^signum must be a valid signal number, not {signum}$"
    ):
        ExitCodes().after_signal(signum, forced=False)


def test_after_signal_refuses_a_non_int():
    with pytest.raises(TypeError, match=r"^signum must be a signal number, not 'x'$"):
        ExitCodes().after_signal("x", forced=False)  # type: ignore[arg-type]


# -- the collector, shared by runs that overlap ---------------------------------------


def test_overlapping_runs_in_two_threads_restore_the_collector():
    before = gc.get_threshold()
    a_draining, b_draining, a_done = (threading.Event() for _ in range(3))
    seen: list[tuple[int, int, int]] = []

    def waiting(event: threading.Event) -> Callable[[], Awaitable[object]]:
        return lambda: trio.to_thread.run_sync(event.wait)

    async def first() -> None:
        current_runner().request_shutdown()
        a_draining.set()
        await waiting(b_draining)()

    async def second() -> None:
        await waiting(a_draining)()
        current_runner().request_shutdown()
        seen.append(gc.get_threshold())
        b_draining.set()
        await waiting(a_done)()
        seen.append(gc.get_threshold())

    statuses: list[int] = []

    def in_thread(main: Callable[[], Awaitable[None]], done: threading.Event) -> None:
        statuses.append(trio_graceful.run(main, signals=(), grace=math.inf))
        done.set()

    threads = [
        threading.Thread(target=in_thread, args=(first, a_done)),
        threading.Thread(target=in_thread, args=(second, threading.Event())),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert statuses == [0, 0]
    # Put off while either run drained, restored when the last one ended.
    assert [t[2] > 1000 for t in seen] == [True, True]
    assert gc.get_threshold() == before


def test_runs_one_after_another_leave_the_collector_as_it_was():
    before = gc.get_threshold()

    async def main() -> None:
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)  # forced: collector paused too
        await trio.sleep(1)

    for _ in range(3):
        assert run(main) == 143
    assert gc.get_threshold() == before
    assert gc.isenabled()


def test_two_signals_in_a_row_are_two_signals(caplog):
    # Trio's own signal receiver merges repeats of a signal not yet taken;
    # escalation counts each one.
    timeline = Timeline()

    async def main() -> None:
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
        try:
            await trio.sleep_forever()
        finally:
            timeline("main cancelled")

    assert run(main) == 143
    assert timeline.events == [(0, "main cancelled")]
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"][:2] == [
        "SIGTERM: shutting down (grace 10 s)",
        "forcing: SIGTERM again",
    ]


# -- what a drain logs ----------------------------------------------------------------


def test_a_forced_drain_logs_its_bundles_progress_and_ends_at_info(caplog):
    caplog.set_level(logging.INFO, logger="trio_graceful")
    release = threading.Event()

    def blocked(stop: trio_graceful.StopFlag) -> None:
        release.wait()

    async def ignorer() -> None:
        await trio.sleep_forever()

    async def main() -> None:
        root = current_runner().root
        root.start_soon(ignorer)
        root.start_soon(trio_graceful.run_in_thread, blocked)
        await trio.testing.wait_all_tasks_blocked()
        signal.raise_signal(signal.SIGTERM)
        await trio.sleep_forever()

    try:
        assert run(main, grace=5) == 143
    finally:
        release.set()
    # One name per bundle, its progress and its end, all at INFO or above.
    lines = [
        (r.levelname, r.getMessage().split(", in ")[0])
        for r in caplog.records
        if r.levelno >= logging.INFO
    ]
    assert lines[:3] == [
        ("WARNING", "SIGTERM: shutting down (grace 5 s)"),
        ("INFO", "bundle 'root': waiting for 3 children, 3.0 s of grace left"),
        ("INFO", "bundle 'root': waiting for 3 children, 1.0 s of grace left"),
    ]
    # At the deadline the root bundle cuts its children off by itself, and
    # the runner notices the deadline in a task of its own: Trio runs the two
    # in either order within that instant.
    # The runner's last line says the status, and why.
    assert lines[-1] == (
        "INFO",
        "exiting with status 143: SIGTERM, forced when the grace ran out",
    )
    assert sorted(lines[3:-1]) == [
        ("INFO", "bundle 'root': 0 finished, 3 hard-cancelled, 0 raised, 1 abandoned"),
        ("INFO", "bundle 'services': 0 finished, 0 hard-cancelled, 0 raised"),
        ("WARNING", "forcing: the grace 5 s ran out"),
    ]
    assert lines[-2][1].startswith("bundle 'services'")


def test_system_exit_from_a_ready_service_gives_its_status_and_stops_in_order():
    timeline = Timeline()
    service = service_for(timeline)

    async def exiting(
        inbox: trio_graceful.InboxReceiver[Any], *, task_status: trio.TaskStatus[None]
    ) -> None:
        task_status.started()
        await trio.sleep(5)
        raise SystemExit(4)

    async def main() -> None:
        runner = current_runner()
        await runner.start_service(service, "db")
        await runner.start_service(exiting)
        await runner.start_service(service, "http")
        _, inbox = runner.root.open_inbox()
        await inbox.receive()
        timeline("main got STOP")

    assert run(main) == 4
    assert timeline.events == [
        (1, "db ready"),
        (2, "http ready"),
        (6, "main got STOP"),
        (6, "http got STOP"),
        (6, "http stopped"),
        (6, "db got STOP"),
        (6, "db stopped"),
    ]
