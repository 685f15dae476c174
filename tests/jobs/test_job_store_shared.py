"""The behaviour every store shares, run against SQLite and a real PostgreSQL.

The exact-time tests are in test_job_store.py (SQLite under the mock
clock); PostgreSQL judges times by its own clock, so these assert order
and counts only.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from tests.support.jobs import serving
from trio_graceful.jobs import (
    IllegalJobTransitionError,
    JobContext,
    JobEvent,
    JobNotFoundError,
    JobState,
    LostJobError,
    Worker,
    _client,
    _holding,
    _leases,
    open_store,
)
from trio_graceful.jobs._sql import Database
from trio_graceful.jobs._store import JobStore

S = JobState


async def test_lifecycle_with_audit_rows(store_url: str) -> None:
    store = open_store(store_url)
    try:
        job_id = await store.submit("k", {"n": 1}, timeout=2.5)
        job = await store.claim("w", lease=30)
        assert job is not None
        assert (job.id, job.state, job.attempts, job.timeout) == (
            job_id,
            S.RUNNING,
            1,
            2.5,
        )
        await store.save_progress(job_id, {"step": 1}, worker="w", attempt=1)
        with pytest.raises(LostJobError):
            await store.save_progress(job_id, {"step": 9}, worker="x", attempt=1)
        with pytest.raises(IllegalJobTransitionError):
            await store.finish(
                job_id, JobEvent.FINISH_CANCEL, worker="w", attempt=1, reason=""
            )
        await store.finish(
            job_id, JobEvent.TIME_OUT, worker="w", attempt=1, reason="late"
        )
        done = await store.finish(
            job_id, JobEvent.FINISH_TIME_OUT, worker="w", attempt=1, reason="cleaned"
        )
        assert (done.state, done.progress) == (S.TIMED_OUT, {"step": 1})
        assert done.timed_out_at is not None
        assert done.ended_at is not None
        assert done.timed_out_at <= done.ended_at
        log = await store.events(job_id)
        assert [(e.source, e.target, e.worker) for e in log] == [
            (None, S.QUEUED, None),
            (S.QUEUED, S.RUNNING, "w"),
            (S.RUNNING, S.TIMING_OUT, "w"),
            (S.TIMING_OUT, S.TIMED_OUT, "w"),
        ]
        assert [e.at for e in log] == sorted(e.at for e in log)
        with pytest.raises(JobNotFoundError, match=r"^no job with id 'nope'$"):
            await store.request_cancel("nope")
    finally:
        store.close()


async def test_cancel_and_rescue(store_url: str) -> None:
    store = open_store(store_url)
    try:
        queued, running, dead = [await store.submit("k") for _ in range(3)]
        assert (await store.request_cancel(queued)).state is S.CANCELLED
        await store.claim("live", lease=600)
        await store.claim("gone", lease=600)
        await store.request_cancel(running)
        assert await store.cancel_requests("live") == [running]
        await store.drop_lease("gone")
        # Only the job of the worker without a lease is settled.
        rescued = await store.rescue(rescuer="r")
        assert [(job.id, job.state) for job in rescued] == [(dead, S.QUEUED)]
        assert (await store.get(running)).state is S.RUNNING
        assert list(await store.leases()) == ["live"]
    finally:
        store.close()


async def test_jobs_reads_records_in_the_order_asked(store_url: str) -> None:
    with open_store(store_url) as store:
        first, second, third = [await store.submit(kind) for kind in "abc"]
        await store.request_cancel(second)
        assert [job.id for job in await store.jobs()] == [first, second, third]
        asked = await store.jobs([third, first, second])
        assert [(job.id, job.kind, job.state) for job in asked] == [
            (third, "c", S.QUEUED),
            (first, "a", S.QUEUED),
            (second, "b", S.CANCELLED),
        ]
        assert await store.jobs([]) == []
        with pytest.raises(JobNotFoundError, match=r"^no job with id 'nope'$"):
            await store.jobs([first, "nope"])


def test_concurrent_claims_take_each_job_once(store_url: str) -> None:
    """Eight connections claim at once, in threads: every job exactly once."""
    setup = open_store(store_url)
    ids = {trio.run(setup.submit, "k") for _ in range(40)}
    setup.close()
    claimed: list[str] = []
    lock = threading.Lock()

    def claimer(name: str) -> None:
        store = open_store(store_url)
        queries: Database = store._db  # pyright: ignore[reportPrivateUsage]
        try:
            while job := _holding.claim(
                queries, name, now=0.0, lease=60, stale_after=None
            ):
                with lock:
                    claimed.append(job.id)
        finally:
            store.close()

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(claimed) == sorted(ids)


async def test_postgres_notifies_listening_workers(postgres_url: str) -> None:
    listener = open_store(postgres_url)
    client = open_store(postgres_url)
    try:
        assert listener.listens
        with open_store("sqlite:///:memory:") as plain:
            assert not plain.listens
        await listener.wait_for_news(0.01)  # LISTEN is in place from here on
        assert await listener.wait_for_news(0.01) == []
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                heard: list[list[str]] = []

                async def listen() -> None:
                    heard.append(await listener.wait_for_news(60))

                nursery.start_soon(listen)
                await trio.sleep(0.2)
                job_id = await client.submit("k")
            assert heard == [["submitted"]]
            job = await client.claim("w", lease=60)
            assert job is not None
            await client.request_cancel(job_id)
            # Delivered at the commit, and kept until the listener reads.
            assert await listener.wait_for_news(60) == [f"cancel {job_id}"]
    finally:
        listener.close()
        client.close()


HOUR = 3600.0


def polling_hourly(
    store: JobStore, functions: dict[str, Any], **options: Any
) -> Worker:
    """A worker that polls once an hour: only a NOTIFY brings it news in time."""
    return Worker(
        store, functions, poll_interval=HOUR, lease=HOUR, cancel_grace=HOUR, **options
    )


def stops_when_asked(
    running: trio.Event, stop_seen: trio.Event
) -> Callable[[JobContext], Awaitable[None]]:
    """A job that sets ``running``, waits for its STOP, sets ``stop_seen``, stops."""

    async def job(ctx: JobContext) -> None:
        running.set()
        await ctx.wait_stop()
        stop_seen.set()
        await ctx.checkpoint()  # raises JobStopped

    return job


def hold_first_empty_answer(
    monkeypatch: pytest.MonkeyPatch,
    store: JobStore,
    query: str,
    *,
    when: Callable[[], bool] = lambda: True,
) -> trio.Event:
    """Hold ``store``'s first empty answer to ``query`` until its listener hears news.

    Returns the event set once the answer is held (``when`` says which
    answers count). The worker's loop then goes on with the news already
    heard: only an event taken before the query keeps it.
    """
    held, heard = trio.Event(), trio.Event()
    ask, wait_for_news = getattr(JobStore, query), JobStore.wait_for_news

    async def holding(self: JobStore, *args: Any, **kwargs: Any) -> Any:
        answer = await ask(self, *args, **kwargs)
        if self is store and when() and not held.is_set():
            assert not answer
            held.set()
            await heard.wait()  # the listener takes the news meanwhile
        return answer

    async def hearing(self: JobStore, timeout: float) -> list[str]:
        news = await wait_for_news(self, timeout)
        if self is store and held.is_set() and news:
            heard.set()
        return news

    monkeypatch.setattr(JobStore, query, holding)
    monkeypatch.setattr(JobStore, "wait_for_news", hearing)
    return held


@pytest.mark.realtime
async def test_a_postgres_worker_hears_a_submission_by_notify(
    postgres_url: str,
) -> None:
    """The worker polls once an hour, so only the NOTIFY can bring the job."""
    ran = trio.Event()

    async def quick(ctx: JobContext) -> None:
        ran.set()

    with open_store(postgres_url) as client, open_store(postgres_url) as store:
        await store.wait_for_news(0.01)  # LISTEN is in place from here on
        worker = polling_hourly(store, {"quick": quick})
        with trio.fail_after(60):
            async with serving(worker):
                # Its first claim found nothing: it waits for news.
                await trio.testing.wait_all_tasks_blocked()
                await client.submit("quick")
                await ran.wait()


@pytest.mark.realtime
async def test_a_submission_heard_while_a_claim_is_in_flight_is_not_lost(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim found nothing; the news came before the worker waited for it."""
    ran = trio.Event()

    async def quick(ctx: JobContext) -> None:
        ran.set()

    with open_store(postgres_url) as client, open_store(postgres_url) as store:
        claimed_nothing = hold_first_empty_answer(monkeypatch, store, "claim_many")
        await store.wait_for_news(0.01)  # LISTEN is in place from here on
        worker = polling_hourly(store, {"quick": quick})
        with trio.fail_after(20):
            async with serving(worker):
                await claimed_nothing.wait()
                await client.submit("quick")
                # Only the news can bring the job: the next poll is in an hour.
                await ran.wait()


@pytest.mark.realtime
async def test_a_cancel_request_heard_while_requests_are_read_is_not_lost(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read found nothing; the news came before the worker waited for it."""
    running = trio.Event()
    stop_seen = trio.Event()
    waits_for_stop = stops_when_asked(running, stop_seen)

    with open_store(postgres_url) as client, open_store(postgres_url) as store:
        read_nothing = hold_first_empty_answer(
            monkeypatch, store, "cancel_requests", when=running.is_set
        )
        job_id = await client.submit("wait")
        await store.wait_for_news(0.01)  # LISTEN is in place from here on
        worker = polling_hourly(store, {"wait": waits_for_stop})
        with trio.fail_after(20):
            async with serving(worker):
                await running.wait()
                # A request for another worker's job: this one reads, finds
                # nothing of its own, and its read is held.
                await client.submit("other")
                other = await client.claim("x", lease=HOUR, kinds=["other"])
                assert other is not None
                await client.request_cancel(other.id)
                await read_nothing.wait()
                await client.request_cancel(job_id)
                # Only the news can bring it: the next poll is in an hour.
                await stop_seen.wait()


@pytest.mark.realtime
async def test_a_postgres_worker_hears_a_cancel_request_by_notify(
    postgres_url: str,
) -> None:
    """The worker polls once an hour, so only the NOTIFY can bring the request."""
    running = trio.Event()
    stop_seen = trio.Event()
    waits_for_stop = stops_when_asked(running, stop_seen)

    with open_store(postgres_url) as client, open_store(postgres_url) as store:
        job_id = await client.submit("wait")
        await store.wait_for_news(0.01)  # LISTEN is in place from here on
        worker = polling_hourly(store, {"wait": waits_for_stop}, worker_id="w1")
        with trio.fail_after(60):
            async with serving(worker):
                await running.wait()
                # Every task of the worker waits: for news, its hourly poll
                # or its job; none is about to look at the store by itself.
                await trio.testing.wait_all_tasks_blocked()
                await client.request_cancel(job_id)
                await stop_seen.wait()
        job = await client.get(job_id)
        assert (job.state, job.error) == (S.CANCELLED, "cancelled cooperatively")
        log = await client.events(job_id)
        assert [(e.source, e.target, e.worker) for e in log] == [
            (None, S.QUEUED, None),
            (S.QUEUED, S.RUNNING, "w1"),
            (S.RUNNING, S.CANCELLING, "w1"),
            (S.CANCELLING, S.CANCELLED, "w1"),
        ]


def test_a_claim_extends_the_lease_only_if_less_than_half_is_left(
    store_url: str,
) -> None:
    queries = open_store(store_url)._db  # pyright: ignore[reportPrivateUsage]
    try:
        for _ in range(2):
            _client.submit(queries, "k", {}, timeout=None, max_attempts=3, now=0.0)
        _leases.renew_lease(queries, "w", now=0.0, lease=100)
        [before] = _leases.leases(queries).values()
        # 100 s left of a lease of 150, more than half: the row is left alone.
        assert (
            _holding.claim(queries, "w", now=0.0, lease=150, stale_after=None)
            is not None
        )
        assert _leases.leases(queries) == {"w": before}
        # 100 s left of a lease of 300, less than half: extended.
        assert (
            _holding.claim(queries, "w", now=0.0, lease=300, stale_after=None)
            is not None
        )
        [after] = _leases.leases(queries).values()
        assert after >= before + 199
    finally:
        queries.close()
