"""A settlement and the next claim in one transaction; a store's calls one at a time.

The transaction is seen on the store's own SQLite connection (its trace of
statements); the calls run in real threads, held by the test. A job's
ending is written only once nothing of the job runs.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from tests.jobs.test_job_worker import wait_for_state
from tests.support.jobs import serving
from trio_graceful import current_bundle
from trio_graceful.jobs import (
    JobContext,
    JobEvent,
    JobRecord,
    JobState,
    Worker,
    WorkerReplacedError,
    _holding,
    open_store,
)
from trio_graceful.jobs._claims import Claims
from trio_graceful.jobs._serial import SerialCalls, run_in_thread
from trio_graceful.jobs._sqlite import SQLiteConnection

S = JobState

OPTIONS: dict[str, Any] = {
    "worker": "w",
    "attempt": 1,
    "reason": "returned",
    "limit": 1,
    "lease": 30,
    "stale_after": None,
}


async def test_a_settlement_and_the_next_claim_commit_once(tmp_path: Any) -> None:
    with open_store(f"sqlite:///{tmp_path}/jobs.db") as store:
        first, second = await store.submit("k"), await store.submit("k")
        await store.claim("w", lease=30, incarnation="i")
        statements: list[str] = []
        connection = store._db.connection  # pyright: ignore[reportPrivateUsage]
        assert isinstance(connection, SQLiteConnection)
        db = connection._db  # pyright: ignore[reportPrivateUsage]
        db.set_trace_callback(statements.append)
        done, claimed = await store.finish_then_claim(
            first, JobEvent.COMPLETE, incarnation="i", result="7", **OPTIONS
        )
        db.set_trace_callback(None)
        assert (done.id, done.state, done.result) == (first, S.COMPLETED, 7)
        assert [(j.id, j.state, j.worker) for j in claimed] == [
            (second, S.RUNNING, "w")
        ]
        # One transaction, so one flush to disk for both.
        assert statements.count("BEGIN IMMEDIATE") == 1
        assert statements.count("COMMIT") == 1
        assert statements[-1] == "COMMIT"


async def test_a_replaced_worker_writes_neither_ending_nor_claim(
    store_url: str,
) -> None:
    with open_store(store_url) as store:
        first, second = await store.submit("k"), await store.submit("k")
        await store.claim("w", lease=30, incarnation="old")
        [taken] = await store.take_over("w", incarnation="new", lease=30)
        assert (taken.id, taken.state) == (first, S.QUEUED)
        events = await store.events()
        with pytest.raises(
            WorkerReplacedError,
            match=r"^worker id 'w' was taken over by another process "
            r"\(incarnation new\); this one \(old\) stops$",
        ):
            await store.finish_then_claim(
                first, JobEvent.COMPLETE, incarnation="old", result="7", **OPTIONS
            )
        assert await store.events() == events
        assert [(await store.get(i)).state for i in (first, second)] == [S.QUEUED] * 2


async def test_both_halves_are_checked_before_either_is_written(
    store_url: str,
) -> None:
    with open_store(store_url) as store:
        job_id = await store.submit("k")
        await store.claim("w", lease=30)
        events = await store.events()
        with pytest.raises(ValueError, match=r"^limit must be in 1\.\.2147483647"):
            await store.finish_then_claim(
                job_id, JobEvent.COMPLETE, incarnation=None, **{**OPTIONS, "limit": 0}
            )
        assert await store.events() == events
        assert (await store.get(job_id)).state is S.RUNNING


def claims_of(store: Any) -> Claims:
    return Claims(store, "w", "i", 30.0, 60.0, 1, ("k",))


async def test_only_released_strays_end_the_doubt_of_a_failed_claim(
    tmp_path: Any,
) -> None:
    with open_store(f"sqlite:///{tmp_path}/jobs.db") as store:
        claims = claims_of(store)
        with pytest.raises(OSError, match="lost"), claims.uncertain_on_failure():
            raise OSError("the answer was lost")
        assert claims.uncertain
        # A later claim that succeeds says nothing of the one that failed.
        with claims.uncertain_on_failure():
            pass
        assert claims.uncertain
        stray = await store.submit("k")
        await store.claim("w", lease=30, incarnation="i")  # its answer "lost"
        # Released first (queued again, a hand-back), then claimed anew.
        [again] = await claims.claim(held=[], limit=1)
        assert not claims.uncertain
        assert (again.id, again.attempts, again.handbacks) == (stray, 2, 1)
        targets = [e.target for e in await store.events(stray)]
        assert targets == [S.QUEUED, S.RUNNING, S.QUEUED, S.RUNNING]


async def test_calls_run_one_at_a_time_in_their_order() -> None:
    calls = SerialCalls()
    ran: list[int] = []
    release = threading.Event()

    def record(n: int) -> int:
        if n == 1:
            release.wait()
        ran.append(n)
        return n

    results: list[int] = []

    async def call(n: int) -> None:
        results.append(await calls.run(functools.partial(record, n)))

    async with trio.open_nursery() as nursery:
        for n in (1, 2, 3):
            nursery.start_soon(call, n)
            await trio.testing.wait_all_tasks_blocked()
        assert ran == []  # 2 and 3 wait for 1, which waits for the test
        release.set()
    assert ran == results == [1, 2, 3]


async def test_a_call_once_started_runs_to_its_end() -> None:
    release = threading.Event()

    def blocking() -> str:
        release.wait()
        return "done"

    ran: list[str] = []
    with trio.CancelScope() as scope:
        scope.cancel()
        await run_in_thread(lambda: ran.append("ran"))
    # Cancelled before it started: the call never ran.
    assert scope.cancelled_caught
    assert ran == []
    returned: list[str] = []
    with trio.CancelScope() as scope:

        async def cancel_then_release() -> None:
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()
            release.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_then_release)
            # Cancelled while it runs: it still ends, and its result arrives.
            returned.append(await run_in_thread(blocking))
            await trio.lowlevel.checkpoint()
    assert scope.cancelled_caught
    assert returned == ["done"]


async def test_a_call_raises_what_the_function_raised() -> None:
    def broken() -> None:
        raise LookupError("no such row")

    with pytest.raises(LookupError, match=r"^no such row$"):
        await SerialCalls().run(broken)
    with pytest.raises(LookupError, match=r"^no such row$"):
        await SerialCalls().run(broken, offload=False)


async def test_every_write_returns_the_record_as_read_back(store_url: str) -> None:
    # A write builds the record it returns from the row it locked and what it
    # changed, instead of reading the row again: it must be the same record.
    with open_store(store_url, offload=False) as store:

        async def same(*records: JobRecord) -> None:
            for job in records:
                assert job == await store.get(job.id), job.state

        ids = [await store.submit("k", {"n": n}, timeout=60) for n in range(6)]
        claimed = await store.claim_many("w", limit=5, lease=30, stale_after=9)
        await same(*claimed)
        a, b, c, d, e = (job.id for job in claimed)
        options: dict[str, Any] = {"worker": "w", "attempt": 1}
        await same(
            await store.finish(
                a,
                JobEvent.COMPLETE,
                reason="returned",
                result='{"ok": [1, 2.5]}',
                progress='{"step": 3}',
                failed_subtasks='["fetch"]',
                elapsed=1,
                **options,
            )
        )
        await same(
            await store.finish(
                b,
                JobEvent.FAIL,
                reason="raised",
                error="raised OSError()",
                traceback="Traceback (most recent call last): ...",
                **options,
            )
        )
        await same(await store.finish(c, JobEvent.TIME_OUT, reason="late", **options))
        await same(
            await store.finish(
                c, JobEvent.FINISH_TIME_OUT, reason="done", elapsed=2.25, **options
            )
        )
        await same(
            await store.finish(d, JobEvent.REQUEUE, reason="handed back", **options)
        )
        await same(await store.request_cancel(ids[5]))
        await store.request_cancel(e)
        await same(await store.finish(e, JobEvent.CANCEL, reason="asked", **options))
        done, again = await store.finish_then_claim(
            e,
            JobEvent.FINISH_CANCEL,
            reason="cancelled",
            error="cancelled",
            limit=2,
            lease=30,
            stale_after=None,
            incarnation=None,
            **options,
        )
        await same(done, *again)
        assert [job.id for job in again] == [d]
        await same(*await store.release_strays("w", held=[]))
        [stray] = await store.claim_many("w", limit=1, lease=30)
        await same(*await store.take_over("w", incarnation="new", lease=30))
        assert (await store.get(stray.id)).state is S.QUEUED


def hold_settlements(
    monkeypatch: pytest.MonkeyPatch, hold: Callable[[], object]
) -> None:
    """Call ``hold()`` in the store's thread before each settlement's queries."""
    settle = _holding.finish_group

    def finish_group(*args: Any, **kwargs: Any) -> Any:
        hold()
        return settle(*args, **kwargs)

    monkeypatch.setattr(_holding, "finish_group", finish_group)


@pytest.mark.realtime
async def test_a_jobs_ending_waits_for_the_subtasks_it_left_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[str] = []

    async def job(ctx: JobContext) -> str:
        async def linger() -> None:
            await trio.sleep(0.2)
            order.append("subtask ended")

        current_bundle().start_soon(linger)
        return "returned before its subtask ended"

    with open_store(f"sqlite:///{tmp_path}/jobs.db") as store:
        hold_settlements(monkeypatch, lambda: order.append("written"))
        job_id = await store.submit("k")
        worker = Worker(store, {"k": job}, worker_id="w", poll_interval=0.05)
        with trio.fail_after(60):
            async with serving(worker):
                await wait_for_state(store, job_id, S.COMPLETED)
        assert (await store.get(job_id)).result == "returned before its subtask ended"
    assert order == ["subtask ended", "written"]
