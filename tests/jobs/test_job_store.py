"""The SQLite job store: transitions with their audit rows, claims, leases, rescue."""

from __future__ import annotations

import functools
import math
import sqlite3
import threading
from pathlib import Path

import pytest
import trio

from tests.support import jobs as support
from tests.support.jobs import mock_store
from trio_graceful.jobs import (
    IllegalJobTransitionError,
    JobEvent,
    JobNotFoundError,
    JobState,
    LostJobError,
    StoreError,
    WorkerReplacedError,
    open_store,
)
from trio_graceful.jobs._sql import Database
from trio_graceful.jobs._sqlite import SQLiteConnection

S = JobState


async def test_submit_writes_the_job_and_its_first_audit_row(
    autojump_clock: object,
) -> None:
    store = mock_store()
    await trio.sleep(3)
    job_id = await store.submit("steps", {"steps": 2}, timeout=7, max_attempts=2)
    job = await store.get(job_id)
    assert (job.kind, job.payload, job.state, job.attempts) == (
        "steps",
        {"steps": 2},
        S.QUEUED,
        0,
    )
    assert (job.timeout, job.max_attempts, job.created_at) == (7.0, 2, 3.0)
    [event] = await store.events(job_id)
    assert (event.source, event.target, event.at, event.reason) == (
        None,
        S.QUEUED,
        3.0,
        "submitted",
    )


async def test_claim_takes_the_oldest_job_once(autojump_clock: object) -> None:
    store = mock_store()
    first = await store.submit("k")
    await trio.sleep(1)
    await store.submit("k")
    await trio.sleep(1)
    job = await store.claim("w1", lease=10)
    assert job is not None
    assert (job.id, job.state, job.attempts, job.worker, job.started_at) == (
        first,
        S.RUNNING,
        1,
        "w1",
        2.0,
    )
    assert (await store.claim("w2", lease=10)) is not None
    assert await store.claim("w3", lease=10) is None


async def test_a_write_by_a_worker_that_lost_the_job_changes_nothing(
    autojump_clock: object,
) -> None:
    store = mock_store()
    job_id = await store.submit("k")
    job = await store.claim("w1", lease=10)
    assert job is not None
    before, log = await store.get(job_id), await store.events(job_id)
    with pytest.raises(LostJobError, match=r"^job \w+ attempt 1 no longer belongs"):
        await store.finish(job_id, JobEvent.COMPLETE, worker="w2", attempt=1, reason="")
    with pytest.raises(IllegalJobTransitionError):
        await store.finish(
            job_id, JobEvent.FINISH_CANCEL, worker="w1", attempt=1, reason=""
        )
    assert await store.get(job_id) == before
    assert await store.events(job_id) == log


async def test_progress_is_saved_with_the_heartbeat_time(
    autojump_clock: object,
) -> None:
    store = mock_store()
    job_id = await store.submit("k")
    await store.claim("w", lease=10, stale_after=10)
    assert (await store.get(job_id)).is_stale(10.0)
    await trio.sleep(4)
    await store.save_progress(job_id, {"step": 3}, worker="w", attempt=1)
    job = await store.get(job_id)
    assert (job.progress, job.last_heartbeat_at) == ({"step": 3}, 4.0)
    assert not job.is_stale(4.0 + 9.5)
    assert job.is_stale(4.0 + 10)
    assert job.as_json(now=14.0)["stale"] is True


async def test_cancel_request_cancels_a_queued_job_at_once(
    autojump_clock: object,
) -> None:
    store = mock_store()
    job_id = await store.submit("k")
    await trio.sleep(2)
    job = await store.request_cancel(job_id)
    assert (job.state, job.ended_at, job.cancel_requested_at) == (S.CANCELLED, 2, 2)
    assert await store.claim("w", lease=10) is None


async def test_cancel_request_of_a_running_job_is_recorded_for_its_worker(
    autojump_clock: object,
) -> None:
    store = mock_store()
    job_id = await store.submit("k")
    await store.claim("w", lease=10)
    job = await store.request_cancel(job_id)
    assert (job.state, job.cancel_requested_at) == (S.RUNNING, 0.0)
    assert await store.cancel_requests("w") == [job_id]
    assert await store.cancel_requests("other") == []


async def test_unknown_job_id(autojump_clock: object) -> None:
    store = mock_store()
    with pytest.raises(JobNotFoundError, match=r"^no job with id 'nope'$"):
        await store.request_cancel("nope")
    with pytest.raises(JobNotFoundError):
        await store.get("nope")
    assert await store.events() == []


@pytest.mark.parametrize(
    ("timeout", "error", "message"),
    [
        (-1, ValueError, "timeout must be a finite number > 0, not -1"),
        (0, ValueError, "timeout must be a finite number > 0, not 0"),
        (math.nan, ValueError, "timeout must be a finite number > 0, not nan"),
        (math.inf, ValueError, "timeout must be a finite number > 0, not inf"),
        ("5", TypeError, "timeout must be a number of seconds, not '5'"),
    ],
)
async def test_bad_timeouts_are_refused_and_nothing_is_written(
    autojump_clock: object, timeout: object, error: type[Exception], message: str
) -> None:
    store = mock_store()
    with pytest.raises(error, match=f"^{message}$"):
        await store.submit("k", timeout=timeout)  # type: ignore[arg-type]
    assert await store.jobs() == []


async def test_bad_kind_and_attempts_are_refused(autojump_clock: object) -> None:
    store = mock_store()
    with pytest.raises(ValueError, match=r"^kind must not be empty$"):
        await store.submit("")
    with pytest.raises(
        ValueError, match=r"^max_attempts must be in 1\.\.2147483647, not 0$"
    ):
        await store.submit("k", max_attempts=0)
    assert await store.jobs() == []


@pytest.mark.parametrize(
    "url", ["jobs.db", "sqlite://jobs.db", "sqlite:///", "mysql://x"]
)
def test_malformed_store_urls(url: str) -> None:
    with pytest.raises(ValueError, match=f"^store URL must look like .*, not '{url}'$"):
        open_store(url)


def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"this is not a database, " * 100)
    with pytest.raises(StoreError, match=r"^store file '.*notes.txt' is not a usable"):
        open_store(f"sqlite:///{path}")
    assert path.read_bytes() == b"this is not a database, " * 100


def test_opening_waits_while_another_process_writes_to_a_new_file(
    tmp_path: Path,
) -> None:
    # A file that another process has just created and writes to, not yet in
    # WAL mode: changing the mode does not wait for the lock as statements
    # do, so the store waits for it itself.
    path = tmp_path / "jobs.db"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("CREATE TABLE other (a)")
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO other VALUES (1)")
    release = threading.Timer(0.2, writer.execute, ("COMMIT",))
    release.start()
    try:
        store = open_store(f"sqlite:///{path}")
    finally:
        release.join()
    store.close()
    writer.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    db.close()


def test_the_file_is_durable_and_shared(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'jobs.db'}")
    store.close()
    db = sqlite3.connect(tmp_path / "jobs.db")
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    db.close()


async def test_the_offloaded_store_runs_its_queries_in_threads(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'jobs.db'}")
    support.opened.append(store)
    ids = [await store.submit("k") for _ in range(3)]
    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(functools.partial(store.claim, "w", lease=10))
    assert {job.id: job.state for job in await store.jobs()} == dict.fromkeys(
        ids, S.RUNNING
    )
    store.close()


async def test_rescue_requeues_only_when_the_lease_has_expired(
    autojump_clock: object,
) -> None:
    store = mock_store()
    job_id = await store.submit("k", max_attempts=2)
    await store.claim("dead", lease=5)
    await store.save_progress(job_id, {"step": 4}, worker="dead", attempt=1)
    await trio.sleep(4.5)
    # Old or not, a job whose worker still holds its lease is left alone.
    assert await store.rescue(rescuer="r") == []
    await trio.sleep(0.5)
    [job] = await store.rescue(rescuer="r")
    assert (job.id, job.state, job.attempts, job.progress) == (
        job_id,
        S.QUEUED,
        1,
        {"step": 4},
    )
    last = (await store.events(job_id))[-1]
    assert (last.source, last.target, last.worker, last.at) == (
        S.RUNNING,
        S.QUEUED,
        "r",
        5.0,
    )
    assert last.reason == "worker 'dead' is gone (its lease expired)"
    # The second attempt dies too: that was the last one.
    await store.claim("dead2", lease=1)
    await trio.sleep(1)
    [job] = await store.rescue(rescuer="r")
    assert (job.state, job.attempts) == (S.FAILED, 2)
    assert job.error == (
        "worker 'dead2' is gone (its lease expired) on attempt 2, the last of 2"
    )


async def test_rescue_finishes_cancelling_and_timing_out(
    autojump_clock: object,
) -> None:
    store = mock_store()
    a, b, c = [await store.submit("k") for _ in range(3)]
    for _ in range(3):
        await store.claim("dead", lease=1)
    await store.finish(a, JobEvent.CANCEL, worker="dead", attempt=1, reason="")
    await store.finish(b, JobEvent.TIME_OUT, worker="dead", attempt=1, reason="")
    await store.request_cancel(c)
    await trio.sleep(1)
    rescued = {job.id: job.state for job in await store.rescue(rescuer="r")}
    assert rescued == {a: S.CANCELLED, b: S.TIMED_OUT, c: S.CANCELLED}
    assert [(e.source, e.target) for e in await store.events(c)][-2:] == [
        (S.RUNNING, S.CANCELLING),
        (S.CANCELLING, S.CANCELLED),
    ]


async def test_a_dropped_lease_counts_as_expired(autojump_clock: object) -> None:
    store = mock_store()
    job_id = await store.submit("k")
    await store.claim("w", lease=100)
    await store.drop_lease("w")
    [job] = await store.rescue(rescuer="r")
    assert (job.id, job.state) == (job_id, S.QUEUED)


async def test_a_store_of_an_earlier_release_keeps_its_lease_table(
    tmp_path: Path, autojump_clock: object
) -> None:
    # Leases of an earlier release: no incarnation column. The incarnations
    # live in a table of their own, so such a store is used as it is.
    path = tmp_path / "jobs.db"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE job_workers (id TEXT PRIMARY KEY, expires_at REAL NOT NULL)"
    )
    db.execute("INSERT INTO job_workers VALUES ('w1', 5.0)")
    db.commit()
    db.close()
    store = mock_store(str(path))
    assert await store.take_over("w1", incarnation="new", lease=10) == []
    with pytest.raises(WorkerReplacedError, match=r"\(incarnation new\); this one"):
        await store.renew_lease("w1", lease=10, incarnation="old")
    await trio.sleep(1)
    await store.renew_lease("w1", lease=10, incarnation="new")
    assert await store.leases() == {"w1": 11.0}
    await store.drop_lease("w1")
    assert await store.leases() == {}
    db = sqlite3.connect(path)
    columns = [row[1] for row in db.execute("PRAGMA table_info(job_workers)")]
    db.close()
    assert columns == ["id", "expires_at"]


def test_a_commit_that_fails_rolls_its_transaction_back() -> None:
    # SQLite keeps the transaction open when its COMMIT fails (here a
    # deferred foreign key); the next transaction must still begin.
    db = Database(SQLiteConnection(":memory:"))
    try:
        db.execute("PRAGMA foreign_keys = ON")
        db.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        db.execute(
            "CREATE TABLE child (id INTEGER PRIMARY KEY, parent INTEGER"
            " REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)"
        )
        with (
            pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"),
            db.transaction(),
        ):
            db.execute("INSERT INTO child VALUES (1, 99)")
        with db.transaction():
            db.execute("INSERT INTO parent VALUES (99)")
        assert db.execute("SELECT id FROM child") == []
        assert db.execute("SELECT id FROM parent") == [(99,)]
    finally:
        db.close()
