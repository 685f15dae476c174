"""trio_graceful.run: stages, signals and exit statuses, in exact virtual time.

Each test runs a whole program in-process on a MockClock that jumps when
every task waits, and sends real signals to its own process with
``signal.raise_signal``. The emergency exit, which ends the process, is
tested with subprocesses in test_runner_realtime.py.
"""

from __future__ import annotations

import gc
import logging
import math
import signal
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

import trio_graceful
import trio_graceful.lowlevel
from trio_graceful import (
    STOP,
    ExitCodes,
    IllegalTransitionError,
    LifecycleState,
    current_runner,
)

S = LifecycleState


def run(main: Callable[..., Awaitable[None]], *args: object, **options: Any) -> int:
    options.setdefault("clock", trio.testing.MockClock(autojump_threshold=0))
    return trio_graceful.run(main, *args, **options)


class Timeline:
    """What happened when, in virtual time."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str]] = []

    def __call__(self, what: str) -> None:
        self.events.append((trio.current_time(), what))


def stage_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    """The runner's own log lines, with their levels."""
    return [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name == "trio_graceful.runner" and r.levelno >= logging.INFO
    ]


@pytest.fixture(autouse=True)
def _runner_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="trio_graceful")


# -- main returns: exit 0 --------------------------------------------------------------


def test_main_returning_exits_with_0(caplog):
    timeline = Timeline()

    async def main(x: int, y: int) -> None:
        runner = current_runner()
        timeline(f"main({x}, {y}), {runner.lifecycle.state.value}")
        await trio.sleep(3)

    assert run(main, 1, 2) == 0
    assert timeline.events == [(0, "main(1, 2), ready")]
    assert stage_lines(caplog) == [
        ("INFO", "shutting down (grace 10 s): main returned"),
        ("INFO", "exiting with status 0"),
    ]


def test_main_with_task_status_is_starting_until_it_is_ready():
    timeline = Timeline()

    async def watcher() -> None:
        runner = current_runner()
        await runner.lifecycle.wait_state(S.READY)
        timeline("ready")
        await runner.lifecycle.wait_state(S.TERMINATED)

    async def main(*, task_status: trio.TaskStatus[None]) -> None:
        runner = current_runner()
        runner.root.start_soon(watcher)
        timeline(runner.lifecycle.state.value)
        await trio.sleep(2)
        task_status.started()
        timeline(runner.lifecycle.state.value)

    assert run(main) == 0
    assert timeline.events == [(0, "starting"), (2, "ready"), (2, "ready")]


def test_lifecycle_ends_terminated_with_the_exit_status():
    seen = []

    async def main() -> None:
        seen.append(current_runner())

    assert run(main) == 0
    (runner,) = seen
    assert runner.lifecycle.state is S.TERMINATED
    assert runner.lifecycle.reason == "exit status 0"
    assert repr(runner) == "<trio_graceful.Runner 'main' terminated>"
    assert runner.name == "main"
    assert runner.grace == 10


# -- one signal: graceful shutdown -----------------------------------------------------


@pytest.mark.parametrize(
    ("signum", "status"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)]
)
def test_first_signal_sends_stop_and_waits(caplog, signum, status):
    timeline = Timeline()

    async def main() -> None:
        runner = current_runner()
        _, inbox = runner.root.open_inbox()
        await trio.sleep(5)
        signal.raise_signal(signum)
        message = await inbox.receive()
        timeline(f"got {message}, {runner.lifecycle.state.value}")
        await trio.sleep(3)  # cleaning up
        timeline("cleaned up")

    assert run(main) == status
    assert timeline.events == [(5, "got STOP, shutting down"), (8, "cleaned up")]
    name = signal.Signals(signum).name
    assert stage_lines(caplog) == [
        ("WARNING", f"{name}: shutting down (grace 10 s)"),
        ("INFO", f"exiting with status {status}: {name}"),
    ]


def test_a_signal_is_never_a_keyboard_interrupt():
    timeline = Timeline()

    async def main() -> None:
        _, inbox = current_runner().root.open_inbox()
        signal.raise_signal(signal.SIGINT)
        total = sum(range(100_000))  # no checkpoint for a while
        timeline(f"computed {total}")
        assert await inbox.receive() is STOP

    assert run(main) == 130
    assert timeline.events == [(0, "computed 4999950000")]


def signalled_and_deaf(timeline: Timeline) -> Callable[[], Awaitable[None]]:
    """A main that sends itself SIGTERM, ignores STOP and notes its cancellation."""

    async def main() -> None:
        signal.raise_signal(signal.SIGTERM)
        try:
            await trio.sleep_forever()  # ignores STOP
        finally:
            timeline("main cancelled")

    return main


def test_grace_runs_out_then_hard_cancel(caplog):
    timeline = Timeline()
    main = signalled_and_deaf(timeline)

    assert run(main, grace=7) == 143  # a forced SIGTERM shutdown is no success
    assert timeline.events == [(7, "main cancelled")]
    assert stage_lines(caplog)[:2] == [
        ("WARNING", "SIGTERM: shutting down (grace 7 s)"),
        ("WARNING", "forcing: the grace 7 s ran out"),
    ]


def test_second_signal_hard_cancels_at_once(caplog):
    timeline = Timeline()

    async def main() -> None:
        _, inbox = current_runner().root.open_inbox()
        signal.raise_signal(signal.SIGTERM)
        assert await inbox.receive() is STOP
        try:
            await trio.sleep(4)
            signal.raise_signal(signal.SIGTERM)
            await trio.sleep_forever()
        finally:
            timeline("main cancelled")

    assert run(main) == 143
    assert timeline.events == [(4, "main cancelled")]
    assert stage_lines(caplog)[:2] == [
        ("WARNING", "SIGTERM: shutting down (grace 10 s)"),
        ("WARNING", "forcing: SIGTERM again"),
    ]


def test_lifecycle_transitions_are_traced():
    changes: list[tuple[float, str | None]] = []

    def hook(event: trio_graceful.TraceEvent) -> None:
        if event.kind is trio_graceful.TraceKind.STATE_CHANGED:
            assert event.bundle == ""
            changes.append((event.time, event.detail))

    async def main() -> None:
        trio_graceful.lowlevel.add_trace_hook(hook)
        runner = current_runner()
        runner.lifecycle.degrade("disk full")
        await trio.sleep(1)
        runner.lifecycle.recover()
        await trio.sleep(1)
        signal.raise_signal(signal.SIGTERM)
        await trio.sleep(1)

    assert run(main, name="svc") == 0
    assert changes == [
        (0, "svc: ready -> degraded (disk full)"),
        (1, "svc: degraded -> ready (recovered)"),
        (2, "svc: ready -> shutting down (SIGTERM)"),
        (3, "svc: shutting down -> terminated (exit status 0)"),
    ]


# -- the garbage collector during a shutdown ----------------------------------------


def collector_state() -> tuple[bool, bool]:
    """Whether full collections are put off, and whether the collector is on."""
    return gc.get_threshold()[2] > 1000, gc.isenabled()


def test_a_shutdown_puts_off_full_collections_and_a_forced_one_pauses_them_all():
    seen: list[tuple[str, tuple[bool, bool]]] = []
    before = gc.get_threshold()

    async def main() -> None:
        _, inbox = current_runner().root.open_inbox()
        seen.append(("running", collector_state()))
        signal.raise_signal(signal.SIGTERM)
        assert await inbox.receive() is STOP
        seen.append(("draining", collector_state()))
        try:
            await trio.sleep(1)
            signal.raise_signal(signal.SIGTERM)  # forces the shutdown
            await trio.sleep_forever()
        finally:
            seen.append(("unwinding", collector_state()))

    assert collector_state() == (False, True)
    assert run(main) == 143
    assert seen == [
        ("running", (False, True)),
        ("draining", (True, True)),
        ("unwinding", (True, False)),
    ]
    assert gc.get_threshold() == before
    assert gc.isenabled()


def test_a_program_that_turned_automatic_collection_off_keeps_it_off():
    seen: list[tuple[int, int, int]] = []

    async def main() -> None:
        current_runner().request_shutdown()
        await trio.sleep(1)
        seen.append(gc.get_threshold())

    before = gc.get_threshold()
    gc.set_threshold(0, before[1], before[2])
    try:
        assert run(main) == 0
        assert seen == [(0, before[1], before[2])]
        assert gc.get_threshold() == (0, before[1], before[2])
    finally:
        gc.set_threshold(*before)


def test_signal_during_a_shutdown_that_had_begun_forces_on_the_next():
    timeline = Timeline()

    async def lingering() -> None:
        try:
            await trio.sleep_forever()
        finally:
            timeline("lingering cancelled")

    async def interrupter() -> None:
        await trio.sleep(2)
        signal.raise_signal(signal.SIGINT)
        timeline("first SIGINT")
        await trio.sleep(1)
        signal.raise_signal(signal.SIGINT)

    async def main() -> None:
        runner = current_runner()
        runner.root.start_soon(lingering)
        # Outside the root bundle, so that the forced cancel spares it.
        await runner.start_service(signal_sender, interrupter)

    async def signal_sender(
        inbox: object,
        fn: Callable[[], Awaitable[None]],
        *,
        task_status: trio.TaskStatus[None],
    ) -> None:
        task_status.started()
        await fn()

    # main returns at once: shutdown; the first SIGINT only asks to be sent
    # again; the second forces. The status is the interruption's.
    assert run(main) == 130
    assert timeline.events == [(2, "first SIGINT"), (3, "lingering cancelled")]


class SignallingClock(trio.abc.Clock):
    """A MockClock that raises SIGTERM when trio.run starts it, before any task."""

    def __init__(self) -> None:
        self._clock = trio.testing.MockClock(autojump_threshold=0)

    def start_clock(self) -> None:
        signal.raise_signal(signal.SIGTERM)
        self._clock.start_clock()

    def current_time(self) -> float:
        return self._clock.current_time()

    def deadline_to_sleep_time(self, deadline: float) -> float:
        return self._clock.deadline_to_sleep_time(deadline)


def test_signal_before_main_started_ends_the_program_without_it(caplog):
    caplog.set_level(logging.DEBUG, logger="trio_graceful.lifecycle")
    started: list[str] = []

    async def main() -> None:
        started.append("main")

    assert run(main, clock=SignallingClock()) == 0
    assert started == []
    assert stage_lines(caplog) == [
        ("WARNING", "SIGTERM: shutting down (grace 10 s)"),
        ("INFO", "exiting with status 0: SIGTERM"),
    ]
    assert [
        r.getMessage() for r in caplog.records if r.name == "trio_graceful.lifecycle"
    ] == [
        "main: uninitialized -> starting",
        "main: starting -> shutting down (SIGTERM)",
        "main: shutting down -> terminated (exit status 0)",
    ]


# -- requests, failures and exit statuses ----------------------------------------------


def test_request_shutdown(caplog):
    timeline = Timeline()

    async def main() -> None:
        runner = current_runner()
        _, inbox = runner.root.open_inbox()
        await trio.sleep(2)
        runner.request_shutdown("maintenance")
        runner.request_shutdown("twice does nothing")
        assert await inbox.receive() is STOP
        timeline(f"{runner.lifecycle.state.value} ({runner.lifecycle.reason})")

    assert run(main) == 0
    assert timeline.events == [(2, "shutting down (maintenance)")]
    assert stage_lines(caplog)[0] == (
        "INFO",
        "shutting down (grace 10 s): maintenance",
    )


def test_request_shutdown_from_a_thread_needs_from_thread():
    errors: list[str] = []

    def in_thread(runner: trio_graceful.Runner) -> None:
        try:
            runner.request_shutdown()
        except RuntimeError as exc:
            errors.append(str(exc))
        trio.from_thread.run_sync(runner.request_shutdown, "from a thread")

    async def main() -> None:
        runner = current_runner()
        _, inbox = runner.root.open_inbox()
        await trio.to_thread.run_sync(in_thread, runner)
        assert await inbox.receive() is STOP
        assert runner.lifecycle.reason == "from a thread"

    assert run(main) == 0
    assert errors == [
        "Runner.request_shutdown() must be called from the Trio thread of "
        "program 'main'; from another thread use "
        "trio.from_thread.run_sync(runner.request_shutdown)"
    ]


def test_main_raising_shuts_down_gracefully_with_status_1(caplog):
    timeline = Timeline()

    async def helper() -> None:
        _, inbox = current_runner().root.open_inbox()
        assert await inbox.receive() is STOP
        await trio.sleep(1)
        timeline("helper stopped gracefully")

    async def main() -> None:
        current_runner().root.start_soon(helper)
        await trio.sleep(2)
        raise ValueError("boom")

    assert run(main) == 1
    assert timeline.events == [(3, "helper stopped gracefully")]
    (failure,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert failure.getMessage() == "main raised"
    assert failure.exc_info is not None
    assert repr(failure.exc_info[1]) == "ValueError('boom')"


def test_a_root_task_raising_fails_the_run(caplog):
    async def crasher() -> None:
        await trio.sleep(1)
        raise KeyError("lost")

    async def main() -> None:
        current_runner().root.start_soon(crasher)
        await trio.sleep_forever()

    assert run(main) == 1
    (failure,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert failure.getMessage() == "a task of the root bundle raised"


def test_main_must_return_none(caplog):
    async def main() -> None:
        return 3  # type: ignore[return-value]

    assert run(main) == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        "main returned 3; it must return None (raise SystemExit(status) to "
        "choose the exit status)"
    ]


@pytest.mark.parametrize(
    ("code", "status", "errors"),
    [(3, 3, []), (None, 0, []), ("usage: x", 1, ["usage: x"])],
)
def test_system_exit_sets_the_status(caplog, code, status, errors):
    async def main() -> None:
        raise SystemExit(code)

    assert run(main) == status
    assert [
        r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
    ] == errors


def test_system_exit_during_startup_is_not_a_startup_failure():
    async def main(*, task_status: trio.TaskStatus[None]) -> None:
        raise SystemExit(2)

    assert run(main) == 2


def test_exit_codes_can_be_chosen():
    codes = ExitCodes(ok=10, clean_signals=[signal.SIGINT])

    async def main() -> None:
        signal.raise_signal(signal.SIGINT)

    assert run(main, exit_codes=codes) == 10

    async def main2() -> None:
        signal.raise_signal(signal.SIGTERM)

    assert run(main2, exit_codes=codes) == 143


def test_second_signal_is_checked():
    async def main() -> None:
        pass

    with pytest.raises(
        ValueError, match=r'^second_signal must be "force" or "exit", not \'kill\'$'
    ):
        run(main, second_signal="kill")  # type: ignore[arg-type]


def test_clean_after_grace_forgives_the_grace_running_out_not_a_second_signal():
    codes = ExitCodes(clean_after_grace=True)

    async def ignores_stop() -> None:
        signal.raise_signal(signal.SIGTERM)
        await trio.sleep_forever()

    assert run(ignores_stop, grace=3, exit_codes=codes) == 0
    assert run(ignores_stop, grace=3) == 143

    async def signalled_again_while_unwinding() -> None:
        signal.raise_signal(signal.SIGTERM)
        try:
            await trio.sleep_forever()
        finally:  # the grace ran out; now the operator insists
            with trio.CancelScope(shield=True):
                signal.raise_signal(signal.SIGTERM)
                await trio.sleep(0.5)

    assert run(signalled_again_while_unwinding, grace=3, exit_codes=codes) == 143

    async def forced_by_a_signal() -> None:
        signal.raise_signal(signal.SIGTERM)
        await trio.sleep(1)
        signal.raise_signal(signal.SIGTERM)
        await trio.sleep_forever()

    assert run(forced_by_a_signal, grace=3, exit_codes=codes) == 143
    with pytest.raises(
        TypeError, match=r"^clean_after_grace must be True or False, not 1$"
    ):
        ExitCodes(clean_after_grace=1)  # type: ignore[arg-type]


def test_exit_codes_are_checked():
    with pytest.raises(ValueError, match=r"^ok must be from 0 to 255, not 256$"):
        ExitCodes(ok=256)
    with pytest.raises(TypeError, match=r"^emergency must be an int, not '1'$"):
        ExitCodes(emergency="1")  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"^clean_signals must be a collection of signals, not 15$"
    ):
        ExitCodes(clean_signals=15)  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"^clean_signals must hold signal numbers, not 'x'$"
    ):
        ExitCodes(clean_signals=["x"])  # type: ignore[list-item]
    assert ExitCodes().clean_signals == frozenset({signal.SIGTERM})
    assert ExitCodes().after_signal(signal.SIGHUP, forced=False) == 129


# -- services: ordered startup, reverse shutdown, rollback -----------------------------


def service_for(timeline: Timeline, stop_takes: float = 0) -> Any:
    async def service(
        inbox: trio_graceful.InboxReceiver[Any],
        label: str,
        *,
        task_status: trio.TaskStatus[str],
    ) -> None:
        await trio.sleep(1)  # starting takes a second
        timeline(f"{label} ready")
        task_status.started(label.upper())
        try:
            assert await inbox.receive() is STOP
            timeline(f"{label} got STOP")
            await trio.sleep(stop_takes)
            timeline(f"{label} stopped")
        finally:
            if not trio.current_effective_deadline() > trio.current_time():
                timeline(f"{label} hard-cancelled")

    return service


class Resource:
    def __init__(self, timeline: Timeline, label: str) -> None:
        self.timeline, self.label = timeline, label

    async def __aenter__(self) -> str:
        self.timeline(f"{self.label} opened")
        return self.label

    async def __aexit__(self, *exc_info: object) -> None:
        self.timeline(f"{self.label} closed")


def test_services_start_in_order_and_stop_in_reverse_after_main():
    timeline = Timeline()
    service = service_for(timeline, stop_takes=2)

    async def main(*, task_status: trio.TaskStatus[None]) -> None:
        runner = current_runner()
        assert await runner.enter_resource(Resource(timeline, "db")) == "db"
        assert await runner.start_service(service, "cache", name="cache") == "CACHE"
        assert await runner.start_service(service, "http") == "HTTP"
        _, inbox = runner.root.open_inbox()
        task_status.started()
        timeline("main ready")
        await trio.sleep(10)
        signal.raise_signal(signal.SIGTERM)
        assert await inbox.receive() is STOP
        await trio.sleep(1)
        timeline("main stopped")

    assert run(main) == 0
    assert timeline.events == [
        (0, "db opened"),
        (1, "cache ready"),
        (2, "http ready"),
        (2, "main ready"),
        (13, "main stopped"),
        (13, "http got STOP"),
        (15, "http stopped"),
        (15, "cache got STOP"),
        (17, "cache stopped"),
        (17, "db closed"),
    ]


def test_one_deadline_bounds_the_whole_shutdown():
    timeline = Timeline()
    service = service_for(timeline, stop_takes=4)

    async def main() -> None:
        runner = current_runner()
        await runner.start_service(service, "a")
        await runner.start_service(service, "b")
        await runner.start_service(service, "c")
        await trio.sleep(7)
        signal.raise_signal(signal.SIGTERM)
        await trio.sleep(1)  # main itself takes a second

    assert run(main) == 143
    # Shutdown at 10, deadline at 20: main 1 s, c 4 s, b 4 s, a cut short.
    assert [e for e in timeline.events if e[0] >= 10] == [
        (11, "c got STOP"),
        (15, "c stopped"),
        (15, "b got STOP"),
        (19, "b stopped"),
        (19, "a got STOP"),
        (20, "a hard-cancelled"),
    ]


def test_a_failing_start_rolls_back_in_reverse_and_exits_1(caplog):
    caplog.set_level(logging.DEBUG, logger="trio_graceful")
    timeline = Timeline()
    service = service_for(timeline)

    async def broken(inbox: object, *, task_status: trio.TaskStatus[None]) -> None:
        await trio.sleep(1)
        raise ConnectionError("no database")

    async def main(*, task_status: trio.TaskStatus[None]) -> None:
        runner = current_runner()
        await runner.enter_resource(Resource(timeline, "config"))
        await runner.start_service(service, "cache")
        await runner.start_service(broken)
        timeline("never reached")
        task_status.started()

    assert run(main) == 1
    assert timeline.events == [
        (0, "config opened"),
        (1, "cache ready"),
        (2, "cache got STOP"),
        (2, "cache stopped"),
        (2, "config closed"),
    ]
    # One line says what failed, and the last the status; the traceback is
    # at DEBUG, and so is the rollback, whose lines would bury it.
    failure, last = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert (last.levelno, last.getMessage()) == (
        logging.INFO,
        "exiting with status 1: startup failed",
    )
    assert failure.levelno == logging.ERROR
    assert failure.getMessage() == "startup failed: ConnectionError: no database"
    assert failure.exc_info is None
    (traceback,) = [r for r in caplog.records if r.exc_info is not None]
    assert (traceback.levelno, traceback.getMessage()) == (
        logging.DEBUG,
        "startup failed",
    )
    assert repr(traceback.exc_info[1]) == "ConnectionError('no database')"


def test_startup_failure_status_can_differ_from_error():
    async def main(*, task_status: trio.TaskStatus[None]) -> None:
        raise RuntimeError("bad config")

    assert run(main, exit_codes=ExitCodes(startup_failed=78)) == 78


def test_startup_timeout_rolls_back_gracefully(caplog):
    timeline = Timeline()
    service = service_for(timeline)

    async def main(*, task_status: trio.TaskStatus[None]) -> None:
        runner = current_runner()
        await runner.start_service(service, "cache")
        try:
            await trio.sleep_forever()  # never ready
        finally:
            timeline(f"main cancelled, {runner.lifecycle.state.value}")

    assert run(main, startup_timeout=30) == 1
    assert timeline.events == [
        (1, "cache ready"),
        (30, "main cancelled, shutting down"),
        (30, "cache got STOP"),
        (30, "cache stopped"),
    ]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        "startup failed: main was not ready within 30 s"
    ]


def test_main_returning_without_being_ready_is_a_startup_failure(caplog):
    async def main(*, task_status: trio.TaskStatus[None]) -> None:
        pass

    assert run(main) == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        "startup failed: main returned without calling task_status.started()"
    ]


def test_signal_during_startup_cancels_it_and_rolls_back():
    timeline = Timeline()
    service = service_for(timeline)

    async def main(*, task_status: trio.TaskStatus[None]) -> None:
        runner = current_runner()
        await runner.start_service(service, "a")
        signal.raise_signal(signal.SIGINT)
        try:
            await runner.start_service(service, "b")  # cancelled while starting
        finally:
            timeline(f"main cancelled, {runner.lifecycle.state.value}")

    assert run(main) == 130  # interrupted, not a failed startup
    # b, still starting, gets STOP rather than a hard cancel: it reads it
    # once ready, and a stops after it.
    assert timeline.events == [
        (1, "a ready"),
        (1, "main cancelled, shutting down"),
        (2, "b ready"),
        (2, "b got STOP"),
        (2, "b stopped"),
        (2, "a got STOP"),
        (2, "a stopped"),
    ]


def failing_service(after: float) -> Any:
    """A service that is ready at once and raises ``after`` seconds later."""

    async def flaky(inbox: object, *, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        await trio.sleep(after)
        raise OSError("disk gone")

    return flaky


def test_a_service_failing_once_ready_shuts_down_with_1(caplog):
    timeline = Timeline()
    flaky = failing_service(5)

    async def main() -> None:
        runner = current_runner()
        _, inbox = runner.root.open_inbox()
        await runner.start_service(flaky, name="flaky")
        assert await inbox.receive() is STOP
        timeline(f"main got STOP ({runner.lifecycle.reason})")

    assert run(main) == 1
    assert timeline.events == [(5, "main got STOP (service 'flaky' raised)")]


def test_no_new_services_once_shutting_down():
    errors = []

    async def main() -> None:
        runner = current_runner()
        runner.request_shutdown()
        try:
            await runner.start_service(service_for(Timeline()), "late")
        except RuntimeError as exc:
            errors.append(str(exc))

    assert run(main) == 0
    assert errors == ["program 'main' is shutting down; no new services can be started"]


def test_service_and_resource_arguments_are_checked():
    async def main() -> None:
        runner = current_runner()
        with pytest.raises(
            TypeError,
            match=r"^enter_resource expected an async context manager, not 42$",
        ):
            await runner.enter_resource(42)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"^name must be a string or None, not 1$"):
            await runner.start_service(trio.sleep, name=1)  # type: ignore[arg-type]

    assert run(main) == 0


# -- lifecycle through the runner ------------------------------------------------------


def test_degraded_and_recovered_while_running():
    timeline = Timeline()

    async def main() -> None:
        lifecycle = current_runner().lifecycle
        await trio.sleep(1)
        lifecycle.degrade("cache unreachable")
        timeline(lifecycle.state.value)
        await trio.sleep(1)
        lifecycle.recover()
        timeline(lifecycle.state.value)
        current_runner().request_shutdown()
        with pytest.raises(IllegalTransitionError):
            lifecycle.degrade("too late")
        timeline(lifecycle.state.value)

    assert run(main) == 0
    assert timeline.events == [(1, "degraded"), (2, "ready"), (2, "shutting down")]


# -- arguments and environment ------------------------------------------------------


async def nothing() -> None:
    pass


async def nothing_ready(*, task_status: trio.TaskStatus[None]) -> None:
    task_status.started()


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"grace": -1}, ValueError, r"^grace must be >= 0, not -1$"),
        ({"grace": math.nan}, ValueError, r"^grace must be >= 0, not nan$"),
        (
            {"unwind_budget": "1"},
            TypeError,
            r"^unwind_budget must be a number of seconds, not str '1'$",
        ),
        (
            {"startup_timeout": 5},
            ValueError,
            r"^startup_timeout=5 needs a main that takes task_status and calls "
            r"task_status.started\(\) when it is ready$",
        ),
        (
            {"signals": signal.SIGINT},
            TypeError,
            r"^signals must be a collection of signals, not <Signals.SIGINT: 2>$",
        ),
        (
            {"signals": [signal.SIGKILL]},
            ValueError,
            r"^signals must be signals that can be handled, not <Signals.SIGKILL: 9>$",
        ),
        (
            {"signals": ["SIGINT"]},
            TypeError,
            r"^signals must hold signal numbers, not 'SIGINT'$",
        ),
        (
            {"exit_codes": 0},
            TypeError,
            r"^exit_codes must be an ExitCodes, not 0$",
        ),
        ({"name": 3}, TypeError, r"^name must be a string or None, not 3$"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(options, error, message):
    threads = threading.active_count()
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(error, match=message):
        trio_graceful.run(nothing, **options)
    assert threading.active_count() == threads
    assert signal.getsignal(signal.SIGINT) is handler


def test_main_must_be_callable():
    with pytest.raises(TypeError, match=r"^main must be an async function, not 5$"):
        trio_graceful.run(5)  # type: ignore[arg-type]


def test_startup_timeout_with_task_status_is_accepted():
    assert run(nothing_ready, startup_timeout=5) == 0


def test_not_from_inside_a_trio_run():
    async def outer() -> None:
        with pytest.raises(
            RuntimeError,
            match=(
                r"^trio_graceful.run\(\) was called from inside a Trio run; "
                r"it starts a run of its own$"
            ),
        ):
            trio_graceful.run(nothing)

    trio.run(outer)


def test_signals_need_the_main_thread():
    errors: list[BaseException] = []
    statuses: list[int] = []

    def in_thread() -> None:
        try:
            trio_graceful.run(nothing)
        except RuntimeError as exc:
            errors.append(exc)
        statuses.append(trio_graceful.run(nothing, signals=()))

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    assert [str(e) for e in errors] == [
        "trio_graceful.run() must be called from the main thread to handle "
        "signals; pass signals=() to run it in another thread"
    ]
    assert statuses == [0]


def test_current_runner_outside_a_run():
    with pytest.raises(
        RuntimeError,
        match=(
            r"^current_runner\(\) was called outside trio_graceful.run\(\); "
            r"it only works in the tasks of a program started with it$"
        ),
    ):
        current_runner()


def test_signal_handlers_and_wakeup_fd_are_restored():
    during: list[object] = []

    async def main() -> None:
        during.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    assert run(main) == 0
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    assert during[0] not in before
    # Nobody's wakeup fd is left behind.
    assert signal.set_wakeup_fd(-1) == -1


def test_no_signals_leaves_the_handlers_alone():
    during: list[object] = []

    async def main() -> None:
        during.append(signal.getsignal(signal.SIGTERM))

    assert run(main, signals=()) == 0
    assert during == [signal.SIG_DFL]


def test_name_names_the_program_and_its_bundles():
    seen: list[tuple[str, str]] = []

    async def main() -> None:
        runner = current_runner()
        seen.append((runner.lifecycle.name, runner.root.name))

    assert run(main, name="svc") == 0
    assert seen == [("svc", "root")]
