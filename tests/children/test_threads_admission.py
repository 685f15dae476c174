"""AdmissionGate: refuse at once when full, recover, keep endpoints apart.

Deterministic: the threads block on events the test controls, so who holds
what at each step is known exactly.
"""

from __future__ import annotations

import functools
import threading

import pytest
import trio
import trio.testing

from trio_graceful import (
    AdmissionGate,
    AdmissionGateStatistics,
    BusyError,
    StopFlag,
    ThreadBudget,
    open_bundle,
    run_in_thread,
)


async def wait_threads_released(budget: ThreadBudget) -> None:
    # See tests/children/test_threads.py: threads give their token back on their own.
    while budget.statistics().threads_running:
        await trio.lowlevel.checkpoint()


def block_until(release: threading.Event, started: trio.Event | None = None):
    def work(flag: StopFlag) -> str:
        if started is not None:
            trio.from_thread.run_sync(started.set)
        release.wait()
        return "done"

    return work


# -- the gate on its own ----------------------------------------------------------


def test_gate_admits_up_to_its_quota_then_refuses_and_recovers():
    gate = AdmissionGate(2, name="request_task")
    gate.acquire_nowait()
    with gate:
        assert gate.statistics() == AdmissionGateStatistics(
            quota=2, in_use=2, peak_in_use=2, admitted_total=2, rejected_total=0
        )
        with pytest.raises(
            BusyError,
            match=(
                r"^admission gate 'request_task' is busy: "
                r"every place is in use \(2 places\)$"
            ),
        ):
            gate.acquire_nowait()
        # A refusal changes nothing but the count.
        assert gate.statistics().in_use == 2
    gate.release()
    with gate:  # recovered
        pass
    assert gate.statistics() == AdmissionGateStatistics(
        quota=2, in_use=0, peak_in_use=2, admitted_total=3, rejected_total=1
    )


def test_busy_error_is_would_block_and_names_an_unnamed_gate():
    gate = AdmissionGate(1)
    with gate, pytest.raises(trio.WouldBlock) as info:
        gate.acquire_nowait()
    assert type(info.value) is BusyError
    assert str(info.value) == "admission gate is busy: every place is in use (1 place)"


def test_gate_release_without_acquire_is_refused():
    gate = AdmissionGate(1, name="beat")
    with pytest.raises(
        RuntimeError,
        match=(
            r"^release\(\) called on <trio_graceful.AdmissionGate 'beat', 0/1 in use "
            r"at 0x[0-9a-f]+>, which nobody holds$"
        ),
    ):
        gate.release()
    assert gate.statistics().in_use == 0


def test_gate_properties():
    gate = AdmissionGate(3, name="beat")
    assert (gate.quota, gate.name) == (3, "beat")
    assert AdmissionGate(1).name is None


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((0,), {}, ValueError, r"^quota must be >= 1, not 0$"),
        ((2.0,), {}, TypeError, r"^quota must be an int, not 2.0$"),
        ((False,), {}, TypeError, r"^quota must be an int, not False$"),
        ((1,), {"name": 5}, TypeError, r"^name must be a string or None, not 5$"),
    ],
)
def test_bad_gate_arguments(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        AdmissionGate(*args, **kwargs)


# -- the gate in front of run_in_thread -------------------------------------------


async def test_refused_call_takes_no_token_and_the_gate_recovers(mock_clock):
    budget = ThreadBudget(10)
    gate = AdmissionGate(2, name="request_task")
    release = threading.Event()
    started = [trio.Event(), trio.Event()]
    refused: list[str] = []
    served: list[str] = []

    async def endpoint(work) -> None:
        try:
            served.append(await run_in_thread(work, budget=budget, gate=gate))
        except BusyError as exc:
            refused.append(str(exc))

    async with open_bundle() as bundle:
        for event in started:
            bundle.start_soon(endpoint, block_until(release, event))
            await event.wait()
        bundle.start_soon(endpoint, block_until(release))
        await trio.testing.wait_all_tasks_blocked()
        assert refused == [
            "admission gate 'request_task' is busy: every place is in use (2 places)"
        ]
        assert budget.statistics().threads_running == 2
        assert budget.statistics().tasks_waiting == 0
        release.set()
        await wait_threads_released(budget)
        await trio.testing.wait_all_tasks_blocked()
        assert gate.statistics().in_use == 0
        # Recovered: the next call is admitted and runs.
        bundle.start_soon(endpoint, block_until(release))
    assert served == ["done"] * 3
    assert gate.statistics() == AdmissionGateStatistics(
        quota=2, in_use=0, peak_in_use=2, admitted_total=3, rejected_total=1
    )


async def test_refusal_is_a_checkpoint():
    gate = AdmissionGate(1)
    gate.acquire_nowait()

    async def child() -> None:
        with trio.testing.assert_checkpoints(), pytest.raises(BusyError):
            await run_in_thread(block_until(threading.Event()), gate=gate)

    async with open_bundle() as bundle:
        bundle.start_soon(child)


async def test_a_burst_on_one_endpoint_does_not_starve_another(mock_clock):
    # The shape of a reconnection storm: hundreds of callers on one endpoint,
    # a latency-critical endpoint beside it, one thread budget for both.
    budget = ThreadBudget(6)
    burst_gate = AdmissionGate(2, name="request_task")
    beat_gate = AdmissionGate(2, name="beat")
    release = threading.Event()
    outcome = {"served": 0, "busy": 0}
    beat_done = trio.Event()

    async def request_task() -> None:
        try:
            await run_in_thread(block_until(release), budget=budget, gate=burst_gate)
            outcome["served"] += 1
        except BusyError:
            outcome["busy"] += 1

    def beat(flag: StopFlag) -> str:
        return "alive"

    async def heartbeat() -> None:
        assert await run_in_thread(beat, budget=budget, gate=beat_gate) == "alive"
        beat_done.set()

    async with open_bundle() as bundle:
        for _ in range(300):
            bundle.start_soon(request_task)
        await trio.testing.wait_all_tasks_blocked()
        assert outcome == {"served": 0, "busy": 298}
        bundle.start_soon(heartbeat)
        await beat_done.wait()  # not queued behind the burst
        assert budget.statistics().threads_running == 2
        release.set()
    assert outcome == {"served": 2, "busy": 298}
    assert budget.statistics().peak_threads_running == 3
    assert burst_gate.statistics().peak_in_use == 2


async def test_without_a_gate_the_burst_takes_every_token(mock_clock):
    # The contrast: the same burst, no gate; the heartbeat has to queue.
    budget = ThreadBudget(6)
    release = threading.Event()
    beat_done = trio.Event()

    def beat(flag: StopFlag) -> str:
        return "alive"

    async def heartbeat() -> None:
        await run_in_thread(beat, budget=budget)
        beat_done.set()

    async with open_bundle() as bundle:
        for _ in range(300):
            bundle.start_soon(
                functools.partial(run_in_thread, budget=budget),
                block_until(release),
            )
        await trio.testing.wait_all_tasks_blocked()
        bundle.start_soon(heartbeat)
        await trio.testing.wait_all_tasks_blocked()
        stats = budget.statistics()
        assert (stats.threads_running, stats.tasks_waiting) == (6, 295)
        assert not beat_done.is_set()
        release.set()
    assert beat_done.is_set()
    assert budget.statistics().peak_threads_running == 6


async def test_an_abandoned_thread_keeps_its_place_in_the_gate(mock_clock):
    budget = ThreadBudget(4)
    gate = AdmissionGate(1, name="export")
    release = threading.Event()
    started = trio.Event()

    async with open_bundle() as bundle:
        bundle.start_soon(
            functools.partial(run_in_thread, budget=budget, gate=gate),
            block_until(release, started),
        )
        await started.wait()
        mock_clock.autojump_threshold = 0
        report = await bundle.cancel(grace=1)
    assert len(report.abandoned) == 1
    # The endpoint stays full while its thread runs on.
    assert gate.statistics().in_use == 1
    with pytest.raises(BusyError):
        gate.acquire_nowait()
    release.set()
    await wait_threads_released(budget)
    assert gate.statistics().in_use == 0
