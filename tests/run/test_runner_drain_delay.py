"""The drain delay, the stop budget and the program's status, in exact virtual time.

After the first signal a ready program is *withdrawn*: not ready, still
serving, for ``drain_delay`` seconds; then the shutdown proper begins. The
stop budget holds the delay, the grace and the unwind budget, or they are
shortened to fit it. `Runner.status` reports both.
"""

from __future__ import annotations

import json
import logging
import math
import signal
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, strategies as st

import trio_graceful
from tests.run.test_runner import (
    Timeline,
    failing_service,
    run,
    signalled_and_deaf,
    stage_lines,
)
from trio_graceful import STOP, LifecycleState, ProgramStatus, current_runner
from trio_graceful._run._shutdown._stoptime import (
    WATCHDOG_MARGIN,
    StopTimes,
    fit_stop_budget,
)

S = LifecycleState


@pytest.fixture(autouse=True)
def _runner_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="trio_graceful")


def status_line(status: ProgramStatus) -> tuple[Any, ...]:
    return (
        status.state,
        status.ready,
        status.drain_delay_left,
        status.grace_left,
        status.tasks_running,
    )


# -- the drain delay -------------------------------------------------------------------


def test_a_signal_withdraws_a_ready_program_then_stop_comes_after_the_delay(caplog):
    timeline = Timeline()

    async def client(sender: trio_graceful.InboxSender[str]) -> None:
        await trio.sleep(5)
        signal.raise_signal(signal.SIGTERM)
        await trio.sleep(1)
        await sender.send("request")  # still served normally
        await trio.sleep(0.5)

    async def main() -> None:
        runner = current_runner()
        sender, inbox = runner.root.open_inbox()
        runner.root.start_soon(client, sender)
        async for message in inbox:
            timeline(f"{message}: {status_line(runner.status())}")
        timeline(f"STOP: {runner.lifecycle.state.value}")

    assert run(main, drain_delay=3) == 0
    assert timeline.events == [
        (6, f"request: {(S.WITHDRAWN, False, 2.0, None, 2)}"),
        (8, "STOP: shutting down"),
    ]
    assert stage_lines(caplog) == [
        (
            "WARNING",
            "SIGTERM: not ready; serving 3 s more (drain delay), "
            "then shutting down (grace 10 s)",
        ),
        ("INFO", "shutting down (grace 10 s): SIGTERM, after the drain delay"),
        ("INFO", "exiting with status 0: SIGTERM"),
    ]


def test_the_grace_begins_when_the_delay_ends(caplog):
    timeline = Timeline()
    main = signalled_and_deaf(timeline)

    assert run(main, drain_delay=2, grace=7) == 143
    assert timeline.events == [(9, "main cancelled")]


def test_a_second_signal_during_the_delay_forces_at_once(caplog):
    timeline = Timeline()

    async def main() -> None:
        runner = current_runner()
        signal.raise_signal(signal.SIGTERM)
        await trio.sleep(1)
        try:
            signal.raise_signal(signal.SIGTERM)
            await trio.sleep_forever()
        finally:
            timeline(f"cancelled: {runner.lifecycle.state.value}")

    assert run(main, drain_delay=5) == 143
    assert timeline.events == [(1, "cancelled: shutting down")]
    assert [line for _, line in stage_lines(caplog)][1:3] == [
        "shutting down (grace 10 s): SIGTERM again, during the drain delay",
        "forcing: SIGTERM again",
    ]


def test_a_program_not_yet_ready_skips_the_delay():
    timeline = Timeline()

    async def main(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
        runner = current_runner()
        _, inbox = runner.root.open_inbox()
        signal.raise_signal(signal.SIGTERM)
        await runner.lifecycle.wait_state(S.SHUTTING_DOWN)
        timeline(runner.lifecycle.state.value)
        try:
            await trio.sleep_forever()
        finally:
            timeline("startup cancelled")
        del inbox

    assert run(main, drain_delay=5) == 0
    assert timeline.events == [(0, "shutting down"), (0, "startup cancelled")]


def test_main_returning_during_the_delay_shuts_down_at_once():
    timeline = Timeline()

    async def main() -> None:
        runner = current_runner()
        runner.request_shutdown("deploy")
        runner.request_shutdown("twice does nothing")
        assert runner.lifecycle.state is S.WITHDRAWN
        assert runner.lifecycle.reason == "deploy"
        await trio.sleep(1)
        timeline("main returns")

    assert run(main, drain_delay=5) == 0
    assert timeline.events == [(1, "main returns")]


def test_a_degraded_program_is_withdrawn_too():
    timeline = Timeline()

    async def main() -> None:
        runner = current_runner()
        _, inbox = runner.root.open_inbox()
        runner.lifecycle.degrade("cache down")
        assert runner.status().ready
        runner.request_shutdown()
        timeline(f"{runner.lifecycle.state.value}, ready={runner.status().ready}")
        assert await inbox.receive() is STOP
        timeline(runner.lifecycle.state.value)

    assert run(main, drain_delay=2) == 0
    assert timeline.events == [(0, "withdrawn, ready=False"), (2, "shutting down")]


def test_a_failure_during_the_delay_shuts_down_at_once(caplog):
    timeline = Timeline()

    async def main() -> None:
        runner = current_runner()
        _, inbox = runner.root.open_inbox()
        await runner.start_service(failing_service(1))
        runner.request_shutdown()
        assert await inbox.receive() is STOP
        timeline(runner.lifecycle.state.value)

    assert run(main, drain_delay=4) == 1
    assert timeline.events == [(1, "shutting down")]


# -- the status ------------------------------------------------------------------------


def test_the_status_follows_the_shutdown():
    seen: list[tuple[float, dict[str, object]]] = []

    async def service(inbox: trio_graceful.InboxReceiver[object], *, task_status):
        task_status.started()
        await inbox.receive()
        await trio.sleep(2)

    async def main() -> None:
        runner = current_runner()
        await runner.start_service(service, name="cache")
        _, inbox = runner.root.open_inbox()
        seen.append((trio.current_time(), runner.status().as_dict()))
        runner.request_shutdown("deploy")
        assert await inbox.receive() is STOP
        await trio.sleep(1)
        seen.append((trio.current_time(), runner.status().as_dict()))
        runner.root.start_soon(watch_services, runner)

    async def watch_services(runner: trio_graceful.Runner) -> None:
        await trio.sleep(1.5)  # main has returned; the service drains
        seen.append((trio.current_time(), runner.status().as_dict()))

    assert run(main, name="svc", drain_delay=1, grace=6) == 0
    first = {
        "name": "svc",
        "state": "ready",
        "reason": "main is ready",
        "ready": True,
        "live": True,
        "drain_delay_left": None,
        "grace_left": None,
        "forced": False,
        "tasks_running": 1,
        "services_running": ["cache"],
    }
    assert seen[0] == (0, first)
    assert seen[1] == (
        2,
        first
        | {
            "state": "shutting down",
            "reason": "deploy, after the drain delay",
            "ready": False,
            "grace_left": 5.0,
        },
    )
    assert seen[2][0] == 3.5
    assert seen[2][1]["tasks_running"] == 1  # watch_services itself
    assert json.loads(json.dumps(seen[2][1]))["grace_left"] == 3.5


def test_describe_says_what_a_person_wants_to_know():
    base = ProgramStatus(
        name="svc",
        state=S.WITHDRAWN,
        reason="SIGTERM",
        ready=False,
        live=True,
        drain_delay_left=1.25,
        grace_left=None,
        forced=False,
        tasks_running=3,
        services_running=("health",),
    )
    assert base.describe() == "withdrawn: serving 1.2 s more, 3 tasks running"
    draining = base.__class__(
        **(
            base.as_dict()
            | {
                "state": S.SHUTTING_DOWN,
                "drain_delay_left": None,
                "grace_left": 4.0,
                "services_running": ("health",),
            }
        )  # type: ignore[arg-type]
    )
    assert draining.describe() == (
        "shutting down: waiting for 3 tasks and 1 service, 4.0 s of grace left"
    )


def test_status_from_another_thread_needs_from_thread():
    async def main() -> None:
        runner = current_runner()
        needs = r"trio.from_thread.run_sync\(runner.status\)"
        with pytest.raises(RuntimeError, match=needs):
            await trio.to_thread.run_sync(runner.status)
        status = await trio.to_thread.run_sync(trio.from_thread.run_sync, runner.status)
        assert status.state is S.READY

    assert run(main) == 0


# -- the stop budget -------------------------------------------------------------------


def test_a_budget_that_holds_everything_changes_nothing(caplog):
    async def main() -> None:
        runner = current_runner()
        assert (runner.grace, runner.drain_delay) == (10, 5)

    assert run(main, drain_delay=5, stop_budget=20) == 0
    assert not [r for r in caplog.records if "stop budget" in r.getMessage()]


def test_a_budget_too_small_shortens_the_grace_and_says_so(caplog):
    timeline = Timeline()

    async def main() -> None:
        runner = current_runner()
        timeline(f"grace {runner.grace:g}, delay {runner.drain_delay:g}")
        signal.raise_signal(signal.SIGTERM)
        try:
            await trio.sleep_forever()
        finally:
            timeline("cancelled")

    assert run(main, drain_delay=5, grace=30, stop_budget=20) == 143
    assert timeline.events == [(0, "grace 10, delay 5"), (15, "cancelled")]
    assert stage_lines(caplog)[0] == (
        "WARNING",
        "the shutdown does not fit the stop budget of 20 s: drain_delay 5 s + "
        "grace 30 s + unwind_budget 3 s + 2 s for the emergency exit = 40 s; "
        "shortened to fit: grace 30 s -> 10 s",
    )


def test_a_grace_shortened_to_zero_is_called_out():
    # --stop-budget 3 --grace 5: 3 s minus the emergency exit's 2 s leave 1 s,
    # all of it for the unwind budget; no grace is left at all.
    times = StopTimes(drain_delay=0, grace=5, unwind_budget=3, stop_budget=3)
    fitted, warning = fit_stop_budget(times)
    assert fitted == StopTimes(drain_delay=0, grace=0, unwind_budget=1, stop_budget=3)
    assert warning == (
        "the shutdown does not fit the stop budget of 3 s: drain_delay 0 s + "
        "grace 5 s + unwind_budget 3 s + 2 s for the emergency exit = 10 s; "
        "shortened to fit: grace 5 s -> 0 s, unwind_budget 3 s -> 1 s; "
        "the grace is now 0: at the shutdown main and its tasks are "
        "hard-cancelled at once, with no time to finish their work"
    )


def test_a_budget_that_cannot_be_met_even_shortened_says_so(caplog):
    async def main() -> None:
        pass

    assert run(main, grace=5, stop_budget=1) == 0
    assert stage_lines(caplog)[0] == (
        "WARNING",
        "the shutdown does not fit the stop budget of 1 s: drain_delay 0 s + "
        "grace 5 s + unwind_budget 3 s + 2 s for the emergency exit = 10 s; "
        "shortened to fit: grace 5 s -> 0 s, unwind_budget 3 s -> 0 s; "
        "it still does not fit: the emergency exit alone takes 2 s, so SIGKILL "
        "may come before the report and the exit status; give a stop budget "
        "of at least 2 s; "
        "the grace is now 0: at the shutdown main and its tasks are "
        "hard-cancelled at once, with no time to finish their work",
    )


def test_a_zero_grace_asked_for_is_not_called_shortened():
    times = StopTimes(drain_delay=0, grace=0, unwind_budget=3, stop_budget=4)
    fitted, warning = fit_stop_budget(times)
    assert fitted.grace == 0
    assert warning is not None
    assert "the grace is now 0" not in warning


@given(
    st.floats(0, 100),
    st.one_of(st.floats(0, 100), st.just(math.inf)),
    st.floats(0, 10),
    st.one_of(st.floats(0, 200), st.just(math.inf)),
)
def test_fitting_the_budget(delay, grace, unwind, budget):
    times = StopTimes(
        drain_delay=delay, grace=grace, unwind_budget=unwind, stop_budget=budget
    )
    fitted, warning = fit_stop_budget(times)
    if times.total <= budget:
        assert (fitted, warning) == (times, None)
        return
    assert warning is not None
    assert f"stop budget of {budget:g} s" in warning
    room = max(0.0, budget - WATCHDOG_MARGIN)
    assert fitted.total - WATCHDOG_MARGIN <= room * (1 + 1e-12)
    # The grace gives way first, then the delay, then the unwind budget.
    assert fitted.unwind_budget == min(unwind, room)
    assert fitted.drain_delay == min(delay, room - fitted.unwind_budget)
    assert fitted.grace <= grace
    assert ("it still does not fit" in warning) == (fitted.total > budget)
    assert ("the grace is now 0" in warning) == (fitted.grace == 0 < grace)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"drain_delay": -1}, ValueError, "drain_delay must be >= 0, not -1"),
        ({"drain_delay": math.nan}, ValueError, "drain_delay must be >= 0, not nan"),
        ({"stop_budget": -0.5}, ValueError, "stop_budget must be >= 0, not -0.5"),
        ({"stop_budget": "30"}, TypeError, "stop_budget must be a number of seconds"),
        ({"health_port": 70000}, ValueError, "health_port must be a port number in"),
        ({"health_port": True}, TypeError, "health_port must be a port number, not"),
        ({"health_host": 1, "health_port": 0}, TypeError, "health_host must be a"),
        ({"health_host": "::1"}, ValueError, "health_host='::1' needs a health_port"),
    ],
)
def test_bad_options_are_refused_before_anything_runs(options, error, message):
    ran: list[str] = []

    async def main() -> None:
        ran.append("main")

    with pytest.raises(error, match=f"^{message}".replace("(", r"\(")):
        trio_graceful.run(main, **options)
    assert ran == []
