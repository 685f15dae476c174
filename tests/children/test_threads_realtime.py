"""Thread budget and admission gates under real bursts, with measured latencies.

These use real threads and the real clock: the point is how the Trio thread
fares while hundreds of calls compete for a few threads. They assert the
hard limits exactly (never more threads than the budget, nobody refused at
an endpoint whose quota is free) and only print the latencies, which depend
on the machine's load; run with ``-s`` to see the numbers.
"""

from __future__ import annotations

import functools
import threading
import time

import attrs
import pytest
import trio

from trio_graceful import (
    AdmissionGate,
    Bundle,
    BusyError,
    StopFlag,
    ThreadBudget,
    open_bundle,
    run_in_thread,
)

pytestmark = pytest.mark.realtime


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return (
        f"n={len(ordered)} p50={at(0.5):.2f} ms p99={at(0.99):.2f} ms "
        f"max={ordered[-1] * 1000:.2f} ms"
    )


@attrs.define
class Concurrency:
    """Counts the threads inside a function at once, from the threads."""

    lock: threading.Lock = attrs.field(factory=threading.Lock)
    now: int = 0
    peak: int = 0

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


async def probe_latency(period: float, samples: list[float], done: trio.Event) -> None:
    """A latency-critical Trio task: how late does it wake up?"""
    while not done.is_set():
        start = trio.current_time()
        await trio.sleep(period)
        samples.append(trio.current_time() - start - period)


async def test_budget_holds_under_a_burst_and_trio_keeps_its_latency():
    budget = ThreadBudget(8)
    inside = Concurrency()
    calls = 500

    def blocking_io(flag: StopFlag, i: int) -> int:
        inside.enter()
        time.sleep(0.004)
        inside.leave()
        return i

    results: list[int] = []

    async def call(i: int) -> None:
        results.append(await run_in_thread(blocking_io, i, budget=budget))

    quiet: list[float] = []
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(probe_latency, 0.005, quiet, done)
        await trio.sleep(0.5)
        done.set()

    loaded: list[float] = []
    done = trio.Event()
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(probe_latency, 0.005, loaded, done)
        async with open_bundle(name="burst") as bundle:
            for i in range(calls):
                bundle.start_soon(call, i)
        done.set()
    elapsed = time.perf_counter() - started

    # For comparison, the same burst through plain trio.to_thread.run_sync.
    limiter = trio.CapacityLimiter(8)
    plain: list[float] = []
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(probe_latency, 0.005, plain, done)
        async with trio.open_nursery() as burst:
            for _ in range(calls):
                burst.start_soon(
                    functools.partial(trio.to_thread.run_sync, limiter=limiter),
                    time.sleep,
                    0.004,
                )
        done.set()

    stats = budget.statistics()
    print(
        f"\n{calls} calls of 4 ms on a budget of 8 threads: {elapsed:.3f} s, "
        f"peak {inside.peak} threads inside, budget peak "
        f"{stats.peak_threads_running}\n"
        f"  trio.sleep(5 ms) lateness, quiet:          {summary(quiet)}\n"
        f"  trio.sleep(5 ms) lateness, run_in_thread:  {summary(loaded)}\n"
        f"  trio.sleep(5 ms) lateness, plain to_thread: {summary(plain)}"
    )
    assert sorted(results) == list(range(calls))
    assert inside.peak <= 8
    assert stats.peak_threads_running == 8
    assert stats.threads_running == 0


@attrs.frozen
class Storm:
    elapsed: float
    refusals: dict[str, int]
    beat_latency: list[float]
    peak_inside: int
    budget_peak: int


async def storm(*, gated: bool) -> Storm:
    """Clients storm one endpoint while another serves heartbeats.

    The storm endpoint serialises on a lock, like a scheduler behind a mutex:
    every thread admitted beyond the first just waits. Refused clients back
    off and retry until served.
    """
    budget = ThreadBudget(8)
    storm_gate = AdmissionGate(4, name="request_task") if gated else None
    beat_gate = AdmissionGate(4, name="beat") if gated else None
    inside = Concurrency()
    scheduler_lock = threading.Lock()
    refusals = {"request_task": 0, "beat": 0}
    beat_latency: list[float] = []

    def request_task(flag: StopFlag) -> None:
        inside.enter()
        with scheduler_lock:
            time.sleep(0.004)
        inside.leave()

    def beat(flag: StopFlag) -> None:
        inside.enter()
        time.sleep(0.0005)
        inside.leave()

    async def client() -> None:
        while True:
            try:
                await run_in_thread(request_task, budget=budget, gate=storm_gate)
            except BusyError:
                refusals["request_task"] += 1
                await trio.sleep(0.01)
            else:
                return

    async def heartbeats(endpoint: Bundle, done: trio.Event) -> None:
        while not done.is_set():
            start = trio.current_time()
            try:
                await run_in_thread(
                    beat, bundle=endpoint, budget=budget, gate=beat_gate
                )
            except BusyError:  # pragma: no cover - the assertions catch it
                refusals["beat"] += 1
            beat_latency.append(trio.current_time() - start)
            await trio.sleep(0.01)

    done = trio.Event()
    started = time.perf_counter()
    async with open_bundle(name="beats") as beats:
        beats.start_soon(heartbeats, beats, done)
        async with open_bundle(name="clients") as bundle:
            for _ in range(100):
                bundle.start_soon(client)
        done.set()
    return Storm(
        elapsed=time.perf_counter() - started,
        refusals=refusals,
        beat_latency=beat_latency,
        peak_inside=inside.peak,
        budget_peak=budget.statistics().peak_threads_running,
    )


async def test_gates_keep_a_burst_from_starving_the_other_endpoint():
    gated = await storm(gated=True)
    ungated = await storm(gated=False)
    print(
        f"\n100 clients storming a serialised 4 ms endpoint, heartbeats every "
        f"10 ms beside it, one budget of 8 threads:\n"
        f"  with gates (4 + 4): {gated.elapsed:.2f} s, {gated.refusals} refused, "
        f"beat latency {summary(gated.beat_latency)}\n"
        f"  without gates:      {ungated.elapsed:.2f} s, "
        f"beat latency {summary(ungated.beat_latency)}"
    )
    for run in (gated, ungated):
        assert run.peak_inside <= 8
        assert run.budget_peak <= 8
    assert gated.refusals["beat"] == 0
    assert gated.refusals["request_task"] > 0
