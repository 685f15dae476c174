"""Group commits: endings that wait for the store are written in one transaction.

The store's turn is held by the test (the lock its calls take), so that
endings gather exactly as they would behind a commit in flight; the store
runs SQLite in the Trio thread under the mock clock.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from tests.jobs.test_job_worker import make_worker, wait_all_in_state
from tests.support.jobs import mock_store, serving
from trio_graceful.jobs import (
    JobContext,
    JobEvent,
    JobRecord,
    JobState,
    JobStore,
    LostJobError,
    StoreError,
    StoreStatistics,
    open_store,
)
from trio_graceful.jobs._sqlite import SQLiteConnection

S = JobState
OPTIONS: dict[str, Any] = {
    "worker": "w",
    "reason": "returned",
    "lease": 30,
    "stale_after": None,
    "incarnation": "i",
}


def commits_of(store: JobStore) -> list[str]:
    """The COMMIT statements the store's connection will run, as they run."""
    statements: list[str] = []
    connection = store._db.connection  # pyright: ignore[reportPrivateUsage]
    assert isinstance(connection, SQLiteConnection)
    db = connection._db  # pyright: ignore[reportPrivateUsage]
    db.set_trace_callback(
        lambda sql: statements.append(sql) if sql == "COMMIT" else None
    )
    return statements


async def claimed(store: JobStore, n: int, queued: int) -> list[JobRecord]:
    """``n`` jobs claimed by worker "w", and ``queued`` more waiting."""
    for _ in range(n + queued):
        await store.submit("k")
        await trio.sleep(1)  # claimed, and listed, in this order
    return await store.claim_many("w", limit=n, lease=30, incarnation="i")


@asynccontextmanager
async def turn_held(store: JobStore) -> AsyncIterator[None]:
    """Hold the store's turn from another task, as a group in flight does."""
    calls = store._calls  # pyright: ignore[reportPrivateUsage]
    done = trio.Event()

    async def hold(task_status: trio.TaskStatus[None]) -> None:
        await calls.acquire()
        task_status.started()
        await done.wait()
        calls.release()

    async with trio.open_nursery() as nursery:
        await nursery.start(hold)
        yield
        done.set()


def state_now(store: JobStore, job: JobRecord) -> JobState:
    """The job's state, read past the store's turn (which the test may hold)."""
    return store._db.get(job.id).state  # pyright: ignore[reportPrivateUsage]


async def test_endings_that_wait_for_the_store_commit_as_one_group(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = mock_store()
    jobs = await claimed(store, 3, queued=3)
    oldest_first = sorted(await store.jobs(), key=lambda job: job.created_at)
    queued = [job.id for job in oldest_first if job.state is S.QUEUED]
    commits = commits_of(store)
    results: dict[str, tuple[JobRecord, list[JobRecord]]] = {}

    async def end(job: JobRecord) -> None:
        results[job.id] = await store.finish_then_claim(
            job.id, JobEvent.COMPLETE, attempt=1, limit=1, result="1", **OPTIONS
        )

    calls = store._calls  # pyright: ignore[reportPrivateUsage]
    await calls.acquire()  # a call in flight
    async with trio.open_nursery() as nursery:
        for job in jobs:
            nursery.start_soon(end, job)
        await trio.testing.wait_all_tasks_blocked()
        assert store._endings.waiting == 3  # pyright: ignore[reportPrivateUsage]
        # Nothing is written, so nothing is reported, before the commit.
        assert [state_now(store, job) for job in jobs] == [S.RUNNING] * 3
        assert not results
        calls.release()
    assert commits == ["COMMIT"]
    assert store.statistics() == StoreStatistics(groups=1, endings=3, largest_group=3)
    # Each ending claims one successor of its own.
    assert [results[job.id][0].state for job in jobs] == [S.COMPLETED] * 3
    successors = [[j.id for j in results[job.id][1]] for job in jobs]
    assert sorted(successors) == sorted([job_id] for job_id in queued)
    for job in jobs:
        assert [e.target for e in await store.events(job.id)][-1] is S.COMPLETED


async def test_a_lone_ending_commits_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = mock_store()
    [job] = await claimed(store, 1, queued=0)
    commits = commits_of(store)
    start = trio.current_time()
    done = await store.finish(
        job.id, JobEvent.COMPLETE, attempt=1, reason="r", worker="w"
    )
    assert trio.current_time() == start  # no timer: nothing waited for company
    assert (done.state, commits) == (S.COMPLETED, ["COMMIT"])
    assert store.statistics() == StoreStatistics(groups=1, endings=1, largest_group=1)


async def test_a_refused_ending_leaves_the_rest_of_its_group(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = mock_store()
    first, second = await claimed(store, 2, queued=1)
    outcomes: dict[str, Any] = {}

    async def end(job: JobRecord, attempt: int) -> None:
        try:
            outcomes[job.id] = await store.finish_then_claim(
                job.id, JobEvent.COMPLETE, attempt=attempt, limit=1, **OPTIONS
            )
        except LostJobError as exc:
            outcomes[job.id] = exc

    calls = store._calls  # pyright: ignore[reportPrivateUsage]
    await calls.acquire()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(end, first, 2)  # an attempt the worker does not hold
        nursery.start_soon(end, second, 1)
        await trio.testing.wait_all_tasks_blocked()
        calls.release()
    assert isinstance(outcomes[first.id], LostJobError)
    done, [successor] = outcomes[second.id]
    assert done.state is S.COMPLETED
    assert state_now(store, successor) is S.RUNNING
    # The refused ending wrote nothing, and claimed nothing.
    assert state_now(store, first) is S.RUNNING
    assert [e.target for e in await store.events(first.id)] == [S.QUEUED, S.RUNNING]
    assert store.statistics().groups == 1


async def test_an_outage_fails_every_ending_of_the_group_and_writes_nothing(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = mock_store()
    jobs = await claimed(store, 3, queued=3)
    connection = store._db.connection  # pyright: ignore[reportPrivateUsage]
    send = connection.send

    def claim_fails(sql: str, args: Any = ()) -> Any:
        # The claims come after every ending of the group.
        if "ORDER BY created_at" in sql:
            monkeypatch.setattr(connection, "send", send)  # once
            raise sqlite3.OperationalError("database is locked")
        return send(sql, args)

    monkeypatch.setattr(connection, "send", claim_fails)
    errors: list[BaseException] = []

    async def end(job: JobRecord) -> None:
        with pytest.raises(sqlite3.OperationalError) as caught:
            await store.finish_then_claim(
                job.id, JobEvent.COMPLETE, attempt=1, limit=1, **OPTIONS
            )
        errors.append(caught.value)

    calls = store._calls  # pyright: ignore[reportPrivateUsage]
    await calls.acquire()
    async with trio.open_nursery() as nursery:
        for job in jobs:
            nursery.start_soon(end, job)
        await trio.testing.wait_all_tasks_blocked()
        calls.release()
    assert len(errors) == 3
    assert all(store.is_outage(exc) for exc in errors)
    # Rolled back, all of it: the endings and the claims.
    states = [job.state for job in await store.jobs()]
    assert states == [S.RUNNING] * 3 + [S.QUEUED] * 3
    # Each ending, tried again alone, is written once.
    for job in jobs:
        done = await store.finish(
            job.id, JobEvent.COMPLETE, attempt=1, reason="r", worker="w"
        )
        assert done.state is S.COMPLETED
        targets = [e.target for e in await store.events(job.id)]
        assert targets.count(S.COMPLETED) == 1


async def test_a_cancelled_ending_leaves_its_group_before_it_begins(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = mock_store()
    first, second = await claimed(store, 2, queued=0)
    calls = store._calls  # pyright: ignore[reportPrivateUsage]
    written: list[JobRecord] = []

    async def end(job: JobRecord, scope: trio.CancelScope) -> None:
        with scope:
            written.append(
                await store.finish(
                    job.id, JobEvent.COMPLETE, attempt=1, reason="r", worker="w"
                )
            )

    await calls.acquire()
    leader = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(end, first, leader)  # the one waiting for the turn
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(end, second, trio.CancelScope())
        await trio.testing.wait_all_tasks_blocked()
        assert store._endings.waiting == 2  # pyright: ignore[reportPrivateUsage]
        leader.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert store._endings.waiting == 1  # pyright: ignore[reportPrivateUsage]
        calls.release()  # the other takes the turn in its place
    assert [job.id for job in written] == [second.id]
    assert state_now(store, first) is S.RUNNING
    assert state_now(store, second) is S.COMPLETED
    assert store.statistics() == StoreStatistics(groups=1, endings=1, largest_group=1)


async def test_a_worker_groups_the_endings_of_jobs_that_end_together(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def job(ctx: JobContext) -> None:
        await trio.sleep(1)

    store = mock_store()
    ids = [await store.submit("k") for _ in range(12)]
    worker = make_worker(store, {"k": job}, concurrency=4)
    async with serving(worker):
        await wait_all_in_state(store, ids, S.COMPLETED)
    stats = store.statistics()
    assert stats.endings == 12
    assert stats.groups < 12
    assert stats.largest_group > 1
    for job_id in ids:
        targets = [e.target for e in await store.events(job_id)]
        assert targets == [S.QUEUED, S.RUNNING, S.COMPLETED]


@pytest.mark.realtime
@pytest.mark.parametrize("concurrency", [1, 4])
async def test_on_postgresql_renewals_wait_behind_a_group_only_at_concurrency_1(
    postgres_url: str, concurrency: int
) -> None:
    with open_store(postgres_url) as store:
        await store.reserve_connections(concurrency=concurrency)
        await store.reserve_connections(concurrency=concurrency)  # changes nothing
        async with turn_held(store):
            with trio.move_on_after(5 if concurrency == 1 else 60) as waited:
                await store.renew_lease("w", lease=30)
                await store.submit("k")
                assert [job.state for job in await store.jobs()] == [S.QUEUED]
        assert waited.cancelled_caught is (concurrency == 1)
    with pytest.raises(StoreError, match=r"^the job store is closed$"):
        await store.reserve_connections(concurrency=concurrency)


async def test_a_sqlite_store_keeps_one_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = mock_store()
    await store.reserve_connections(concurrency=10)
    async with turn_held(store):
        with trio.move_on_after(10) as waited:
            await store.renew_lease("w", lease=30)
    assert waited.cancelled_caught
    with pytest.raises(ValueError, match=r"^concurrency must be in 1\.\.\d+, not 0$"):
        await store.reserve_connections(concurrency=0)
