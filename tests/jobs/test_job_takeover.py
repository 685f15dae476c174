"""Jobs taken from a worker whose lease ran out, under the mock clock.

Another worker (here the test, as ``rescuer``) settles the jobs of a worker
whose lease expired, as it would after an outage or a stall; the worker
finds out at its next write (progress, an ending), at the check after its
next lease renewal, or when a claim brings the job back to it. Each time
the attempt is hard-cancelled, nothing more of it is written, a WARNING
names the job and where it is now, and the worker goes on.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing

from tests.jobs.test_job_worker import audit, make_worker, wait_for_state
from tests.support.jobs import mock_store, serving
from trio_graceful.jobs import (
    JobContext,
    JobFunction,
    JobState,
    JobStore,
    _leases,
    open_store,
)
from trio_graceful.jobs._sql import Database

S = JobState


def lost_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "no longer belongs" in r.getMessage()
    ]


def rescue_behind_its_back(store: JobStore, worker_id: str = "w1") -> str:
    """Let the worker's lease lapse and rescue its only job; return the job's id.

    Both at once, with no checkpoint between: a claim of the worker would
    renew its lease.
    """
    db: Database = store._db  # pyright: ignore[reportPrivateUsage]
    _leases.drop_lease(db, worker_id)
    [rescued] = _leases.rescue(db, now=trio.current_time(), rescuer="rescuer")
    assert rescued.state is S.QUEUED
    return rescued.id


class Watched:
    """A job function's record of how it ended, and when."""

    def __init__(self) -> None:
        self.ended: list[tuple[str, float]] = []

    def note(self, how: str) -> None:
        self.ended.append((how, trio.current_time()))


async def quick(ctx: JobContext) -> str:
    await trio.sleep(1)
    return "done"


async def test_a_job_taken_over_is_stopped_at_the_check_after_the_renewal(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    watched = Watched()

    async def silent(ctx: JobContext) -> None:
        # Reports nothing: only the check after a renewal can find it out.
        if ctx.attempt > 1:
            return
        try:
            await trio.sleep(1000)
        except trio.Cancelled:
            watched.note("hard-cancelled")
            raise

    store = mock_store()
    job_id = await store.submit("silent")
    functions: dict[str, JobFunction] = {"silent": silent, "quick": quick}
    worker = make_worker(store, functions, concurrency=1, lease=30)
    async with serving(worker):
        await trio.sleep(1)
        rescue_behind_its_back(store)
        # The lease is renewed every 10 s; the check follows the renewal.
        await trio.sleep(10)
        assert watched.ended == [("hard-cancelled", 10)]
        # The worker goes on: it claims the job again, and another.
        other = await store.submit("quick")
        await wait_for_state(store, other, S.COMPLETED)
        assert (await store.get(job_id)).state is S.COMPLETED
    assert lost_lines(caplog) == [
        f"worker w1: job {job_id} attempt 1 no longer belongs to worker 'w1'; "
        "it is queued, set by worker 'rescuer'; its attempt was stopped"
    ]
    # Nothing of the lost attempt was written after the rescue.
    assert audit(await store.events(job_id))[1:3] == [
        (S.QUEUED, S.RUNNING, 0),
        (S.RUNNING, S.QUEUED, 1),
    ]
    assert worker.statistics().ended["lost"] == 1


async def test_a_job_taken_over_is_stopped_at_its_next_progress_write(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    watched = Watched()

    async def reporting(ctx: JobContext) -> None:
        step = 0
        while True:
            try:
                await trio.sleep(1)
                step += 1
                await ctx.report_progress({"step": step}, save_now=True)
            except Exception:  # swallows everything a job may swallow
                watched.note("swallowed")
            except trio.Cancelled:
                watched.note("hard-cancelled")
                raise

    store = mock_store()
    job_id = await store.submit("reporting")
    worker = make_worker(store, {"reporting": reporting}, concurrency=1, lease=300)
    async with serving(worker):
        await trio.sleep(2.5)
        rescue_behind_its_back(store)
        await trio.sleep(10)
        # Stopped at the report of step 3, at 3 s: long before a renewal.
        assert watched.ended == [("hard-cancelled", 3)]
        job = await store.get(job_id)
        # Claimed again (attempt 2) from the progress that attempt 1 saved.
        assert (job.state, job.attempts) == (S.RUNNING, 2)
    assert lost_lines(caplog) == [
        f"worker w1: job {job_id} attempt 1 no longer belongs to worker 'w1'; "
        "it is queued, set by worker 'rescuer'; its attempt was stopped"
    ]
    assert worker.statistics().ended == {"lost": 1, "queued": 1}


async def test_progress_kept_through_an_outage_finds_the_job_taken_over(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    watched = Watched()

    async def hanging(ctx: JobContext) -> None:
        try:
            await trio.sleep(1000)
        except trio.Cancelled:
            watched.note("hard-cancelled")
            raise

    store = mock_store()
    job_id = await store.submit("hanging")
    worker = make_worker(store, {"hanging": hanging}, concurrency=1, lease=300)
    async with serving(worker):
        await trio.sleep(1)
        supervisor = worker._jobs  # pyright: ignore[reportPrivateUsage]
        # As if reported during an outage that outlasted the lease, in
        # which another worker rescued the job: written once the store is
        # back, by the task that flushes progress.
        supervisor.running[job_id].unsaved = {"step": 7}
        rescue_behind_its_back(store)
        await supervisor.flush_progress()
        await trio.sleep(1)
        assert watched.ended == [("hard-cancelled", 1)]
    assert (await store.get(job_id)).progress is None
    assert lost_lines(caplog) == [
        f"worker w1: job {job_id} attempt 1 no longer belongs to worker 'w1'; "
        "it is queued, set by worker 'rescuer'; its attempt was stopped"
    ]


async def test_a_job_taken_over_writes_no_ending_and_the_worker_goes_on(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    async def returns_later(ctx: JobContext) -> str:
        await trio.sleep(3)
        return "late"

    store = mock_store()
    job_id = await store.submit("returns later")
    functions: dict[str, JobFunction] = {"returns later": returns_later}
    functions["quick"] = quick
    worker = make_worker(store, functions, concurrency=1, lease=300)
    async with serving(worker):
        await trio.sleep(1)
        rescue_behind_its_back(store)
        # Another worker claims it meanwhile (attempt 2).
        claimed = await store.claim("w2", lease=300)
        assert claimed is not None
        assert claimed.id == job_id
        other = await store.submit("quick")
        await wait_for_state(store, other, S.COMPLETED)
    job = await store.get(job_id)
    # The result of attempt 1 was refused: attempt 2 runs on, untouched.
    assert (job.state, job.attempts, job.worker, job.result) == (
        S.RUNNING,
        2,
        "w2",
        None,
    )
    assert lost_lines(caplog) == [
        f"worker w1: job {job_id} attempt 1 no longer belongs to worker 'w1'; "
        "it is running on attempt 2 of worker 'w2'; its attempt was stopped"
    ]
    assert worker.statistics().ended == {"lost": 1, "completed": 1}


async def test_a_job_taken_over_while_cancelling_is_stopped_at_once(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    watched = Watched()

    async def deaf(ctx: JobContext) -> None:
        try:
            await trio.sleep(1000)
        except trio.Cancelled:
            watched.note("hard-cancelled")
            raise

    store = mock_store()
    job_id = await store.submit("deaf")
    worker = make_worker(
        store, {"deaf": deaf}, concurrency=1, lease=30, cancel_grace=100
    )
    async with serving(worker):
        await trio.sleep(1)
        await store.request_cancel(job_id)
        await wait_for_state(store, job_id, S.CANCELLING)
        t0 = trio.current_time()
        await store.drop_lease("w1")
        [rescued] = await store.rescue(rescuer="rescuer")
        assert rescued.state is S.CANCELLED
        await trio.sleep(15)
        # At the check after the next renewal, not after the cancel grace.
        assert len(watched.ended) == 1
        assert watched.ended[0][1] - t0 <= 10
    assert [e.target for e in await store.events(job_id)][-1] is S.CANCELLED
    assert len(lost_lines(caplog)) == 1
    assert worker.statistics().ended == {"lost": 1}


async def test_a_claim_that_brings_back_a_job_stops_its_earlier_attempt(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # The earlier attempt is still in the worker when the job, rescued, is
    # claimed by the same worker again: two attempts of one job at once.
    runs: list[int] = []

    async def counted(ctx: JobContext) -> str:
        runs.append(ctx.attempt)
        await trio.sleep(5)
        return f"attempt {ctx.attempt}"

    store = mock_store()
    job_id = await store.submit("counted")
    worker = make_worker(store, {"counted": counted}, concurrency=2, lease=300)
    async with serving(worker):
        await trio.sleep(1)
        rescue_behind_its_back(store)
        await wait_for_state(store, job_id, S.COMPLETED)
        await trio.sleep(10)
    job = await store.get(job_id)
    assert (job.attempts, job.result) == (2, "attempt 2")
    assert runs == [1, 2]
    assert lost_lines(caplog) == [
        f"worker w1: job {job_id} attempt 1 no longer belongs to worker 'w1'; "
        "it is running on attempt 2 of worker 'w1'; its attempt was stopped"
    ]
    assert worker.statistics().ended == {"lost": 1, "completed": 1}
    assert worker.statistics().running == 0


@pytest.mark.realtime
@pytest.mark.parametrize("meanwhile", ["renewed", "claimed again"])
async def test_a_rescue_settles_only_what_no_live_lease_holds_as_it_writes(
    store_url: str, meanwhile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rescuer read the job while its worker's lease had expired; before
    # it writes, the worker renewed its lease (and maybe, after a first
    # rescuer queued the job, claimed it again), as PostgreSQL's READ
    # COMMITTED lets another transaction commit between the two.
    with open_store(store_url) as store:
        job_id = await store.submit("k")
        await store.claim("w1", lease=0.001)
        db: Database = store._db  # pyright: ignore[reportPrivateUsage]
        select = db.select
        attempts = 2 if meanwhile == "claimed again" else 1

        def select_then_lose_the_race(self: Database, where: str, args: Any) -> Any:
            jobs = select(where, args)
            # What the worker (and a first rescuer) committed meanwhile.
            db.execute("UPDATE jobs SET attempts = ? WHERE id = ?", (attempts, job_id))
            db.execute(
                "UPDATE job_workers SET expires_at = ? WHERE id = 'w1'", (1e300,)
            )
            return jobs

        await trio.sleep(0.01)
        with monkeypatch.context() as patch:
            patch.setattr(Database, "select", select_then_lose_the_race)
            assert await store.rescue(rescuer="late") == []
        job = await store.get(job_id)
        assert (job.state, job.attempts, job.worker) == (S.RUNNING, attempts, "w1")
        # No row of the late rescuer in the audit log.
        assert [e.worker for e in await store.events(job_id)] == [None, "w1"]


@pytest.mark.realtime
async def test_two_rescuers_at_once_settle_each_job_once(store_url: str) -> None:
    with open_store(store_url) as first, open_store(store_url) as second:
        ids = [await first.submit("k") for _ in range(20)]
        for _ in ids:
            await first.claim("dead", lease=0.001)
        await trio.sleep(0.01)
        found: list[list[str]] = []

        async def rescue(store: JobStore, rescuer: str) -> None:
            found.append([job.id for job in await store.rescue(rescuer=rescuer)])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(rescue, first, "r1")
            nursery.start_soon(rescue, second, "r2")
        assert sorted(found[0] + found[1]) == sorted(ids)
        for job_id in ids:
            targets = [e.target for e in await first.events(job_id)]
            assert targets == [S.QUEUED, S.RUNNING, S.QUEUED]
