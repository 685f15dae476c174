"""A service still starting when its start is cancelled: STOP, not a hard cancel.

A service that has not called ``task_status.started()`` yet may have begun
what it must stop gracefully (worker processes that accept already). When
the caller of `Runner.start_service` is cancelled (the shutdown began during
the startup, or the caller's own scope), the service gets STOP and the rest
of the grace, as a ready one does; only the deadline hard-cancels it. In
exact virtual time, as test_runner.py.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest
import trio

from tests.run.test_runner import Timeline, run
from trio_graceful import STOP, InboxReceiver, current_runner


def starting_service(timeline: Timeline, *, drain: float) -> Any:
    """A service that is never ready by itself: it runs until STOP, then drains."""

    async def pool(
        inbox: InboxReceiver[Any], *, task_status: trio.TaskStatus[str]
    ) -> None:
        timeline("pool starting")
        try:
            assert await inbox.receive() is STOP
            timeline("pool got STOP while starting")
            await trio.sleep(drain)
            timeline("pool drained")
        finally:
            if not trio.current_effective_deadline() > trio.current_time():
                timeline("pool hard-cancelled")

    return pool


def test_a_signal_while_a_service_starts_gives_it_stop_and_the_grace(caplog):
    timeline = Timeline()

    async def main(*, task_status: trio.TaskStatus[None]) -> None:
        runner = current_runner()
        try:
            await runner.start_service(starting_service(timeline, drain=4))
        finally:
            timeline(f"main cancelled, {runner.lifecycle.state.value}")

    async def signal_at(seconds: float) -> None:
        await trio.sleep(seconds)
        signal.raise_signal(signal.SIGTERM)

    async def program(*, task_status: trio.TaskStatus[None]) -> None:
        current_runner().root.start_soon(signal_at, 3)
        await main(task_status=task_status)

    assert run(program, grace=10) == 0  # a graceful stop: not forced
    assert timeline.events == [
        (0, "pool starting"),
        (3, "main cancelled, shutting down"),
        (3, "pool got STOP while starting"),
        (7, "pool drained"),
    ]
    assert not [r for r in caplog.records if "forcing" in r.getMessage()]


def test_a_starting_service_that_ignores_stop_ends_at_the_deadline():
    timeline = Timeline()

    async def deaf(inbox: object, *, task_status: trio.TaskStatus[None]) -> None:
        try:
            await trio.sleep_forever()  # starting, never reading its inbox
        finally:
            timeline("deaf hard-cancelled")

    async def main(*, task_status: trio.TaskStatus[None]) -> None:
        runner = current_runner()
        runner.root.start_soon(raise_sigterm_after, 2)
        await runner.start_service(deaf)

    # The stop time is the same one deadline as ever: the grace bounds it
    # (143: forced).
    assert run(main, grace=5) == 143
    assert timeline.events == [(7, "deaf hard-cancelled")]


async def raise_sigterm_after(seconds: float) -> None:
    await trio.sleep(seconds)
    signal.raise_signal(signal.SIGTERM)


def test_services_still_starting_are_stopped_in_reverse_order_with_the_others():
    timeline = Timeline()

    async def ready_one(
        inbox: InboxReceiver[Any], *, task_status: trio.TaskStatus[None]
    ) -> None:
        task_status.started()
        assert await inbox.receive() is STOP
        timeline("db got STOP")

    async def main(*, task_status: trio.TaskStatus[None]) -> None:
        runner = current_runner()
        await runner.start_service(ready_one, name="db")
        runner.root.start_soon(raise_sigterm_after, 1)
        await runner.start_service(starting_service(timeline, drain=2))

    assert run(main) == 0
    # The pool started after the db: the db is stopped once the pool drained.
    assert timeline.events == [
        (0, "pool starting"),
        (1, "pool got STOP while starting"),
        (3, "pool drained"),
        (3, "db got STOP"),
    ]


def test_a_start_cancelled_by_its_caller_stops_the_service_and_the_program_goes_on():
    timeline = Timeline()

    async def main() -> None:
        runner = current_runner()
        with trio.move_on_after(1):
            await runner.start_service(starting_service(timeline, drain=2), name="pool")
        timeline("main moved on")
        assert runner.status().services_running == ("pool",)
        await trio.sleep(5)
        # It returned without being ready: a clean stop, not a failure.
        assert runner.status().services_running == ()
        timeline("main returns")

    assert run(main) == 0
    assert timeline.events == [
        (0, "pool starting"),
        (1, "main moved on"),
        (1, "pool got STOP while starting"),
        (3, "pool drained"),
        (6, "main returns"),
    ]


def test_a_service_failing_after_its_start_was_cancelled_fails_the_program(caplog):
    async def failing(
        inbox: InboxReceiver[Any], *, task_status: trio.TaskStatus[None]
    ) -> None:
        assert await inbox.receive() is STOP
        await trio.sleep(1)
        raise OSError("could not stop the workers")

    async def main(*, task_status: trio.TaskStatus[None]) -> None:
        runner = current_runner()
        runner.root.start_soon(raise_sigterm_after, 1)
        await runner.start_service(failing, name="pool")

    # Nothing is silently dropped: its caller is gone, so it is the
    # service's failure.
    assert run(main) == 1
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        "service 'pool' raised: OSError: could not stop the workers"
    ]


def test_a_service_ready_after_its_start_was_cancelled_gets_stop_all_the_same():
    timeline = Timeline()

    async def slow(
        inbox: InboxReceiver[Any], *, task_status: trio.TaskStatus[str]
    ) -> None:
        await trio.sleep(2)  # starting; not reading its inbox yet
        task_status.started("value nobody takes")
        timeline("slow ready")
        assert await inbox.receive() is STOP
        timeline("slow got STOP")

    async def main() -> None:
        runner = current_runner()
        with trio.move_on_after(1):
            await runner.start_service(slow)
        await trio.sleep(5)

    assert run(main) == 0
    assert timeline.events == [(2, "slow ready"), (2, "slow got STOP")]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "return",
            r"^service 'quick' returned without calling task_status\.started\(\)$",
        ),
        ("raise", r"^bad config$"),
    ],
)
def test_a_start_that_ends_before_ready_raises_in_the_caller(body, message):
    errors: list[BaseException] = []

    async def quick(inbox: object, *, task_status: trio.TaskStatus[None]) -> None:
        await trio.sleep(1)
        if body == "raise":
            raise ValueError("bad config")

    async def main() -> None:
        try:
            await current_runner().start_service(quick, name="quick")
        except (RuntimeError, ValueError) as exc:
            errors.append(exc)

    assert run(main) == 0
    [error] = errors
    assert type(error) is (ValueError if body == "raise" else RuntimeError)
    with pytest.raises(type(error), match=message):
        raise error


def test_started_twice_is_an_error_of_the_service():
    async def twice(inbox: object, *, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        with pytest.raises(RuntimeError, match="called 'started' twice"):
            task_status.started()

    async def main() -> None:
        await current_runner().start_service(twice)

    assert run(main) == 0


def test_a_start_cancelled_in_the_instant_the_service_is_ready_stops_it():
    timeline = Timeline()
    caller = trio.CancelScope()

    async def service(
        inbox: InboxReceiver[Any], *, task_status: trio.TaskStatus[None]
    ) -> None:
        await trio.sleep(1)
        caller.cancel()  # both at once: the caller sees only its cancellation
        task_status.started()
        assert await inbox.receive() is STOP
        timeline("service got STOP")

    async def main() -> None:
        with caller:
            await current_runner().start_service(service)
        timeline("caller cancelled")
        await trio.sleep(5)

    assert run(main) == 0
    assert timeline.events == [(1, "caller cancelled"), (1, "service got STOP")]
