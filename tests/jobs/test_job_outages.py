"""Store outages under a worker, in one process and on the mock clock.

The outage is real: a second connection holds the SQLite file's write lock
(``BEGIN EXCLUSIVE``) and the store's busy timeout is 0, so every write of
the worker fails with "database is locked" at once, as it would after 30 s
with the default timeout. Reads go on (WAL), as they do in a real lock.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings, strategies as st

import trio_graceful
from tests.jobs.test_job_worker import make_worker, wait_all_in_state, wait_for_state
from tests.support import jobs as support
from tests.support.jobs import serving, steps, stubborn
from tests.support.lifecycles import lifecycle_in
from trio_graceful import open_inbox
from trio_graceful._run._program._lifecycle import LifecycleState
from trio_graceful.jobs import (
    TRANSITIONS,
    JobContext,
    JobState,
    JobStore,
    StoreGoneError,
    WorkerReplacedError,
    _leases,
    open_store,
)
from trio_graceful.jobs._access import StoreAccess
from trio_graceful.jobs._attempt import (
    ATTEMPT_TRANSITIONS,
    Attempt,
    AttemptEvent,
    AttemptState,
)
from trio_graceful.jobs._exceptions import IllegalAttemptTransitionError

S = JobState


def locked_store(path: Path) -> JobStore:
    """A store on ``path`` under the mock clock that waits for no lock."""
    store = open_store(
        f"sqlite:///{path}?busy_timeout=0", clock=trio.current_time, offload=False
    )
    support.opened.append(store)
    return store


@contextmanager
def write_lock(path: Path) -> Iterator[None]:
    """Hold the file's write lock, as another process would."""
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")
        yield
        other.execute("COMMIT")
    finally:
        other.close()


def outage_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if "job store" in r.getMessage() and r.name == "trio_graceful.jobs"
    ]


async def test_jobs_run_through_an_outage_and_their_results_are_written_after(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "trio_graceful.jobs")
    store = locked_store(tmp_path / "jobs.db")
    ids = [await store.submit("steps", {"steps": 5}) for _ in range(3)]
    worker = make_worker(store, {"steps": steps}, concurrency=3)
    async with serving(worker):
        await trio.sleep(2.5)
        with write_lock(tmp_path / "jobs.db"):
            await trio.sleep(1)
            assert worker.statistics().running == 3  # the jobs keep running
            await trio.sleep(20)
            # Their functions have returned; their endings wait for the store.
            assert [(await store.get(i)).state for i in ids] == [S.RUNNING] * 3
        await wait_all_in_state(store, ids, S.COMPLETED)
    for job_id in ids:
        job = await store.get(job_id)
        assert (job.result, job.progress, job.error) == (5, {"step": 5}, None)
        targets = [e.target for e in await store.events(job_id)]
        assert targets == [S.QUEUED, S.RUNNING, S.COMPLETED]
    [began, ended] = outage_lines(caplog)
    assert began.startswith("worker w1: job store unreachable (")
    assert "database is locked" in began
    assert began.endswith("; retrying, claiming paused")
    assert ended.startswith("worker w1: job store back after ")


async def test_progress_reported_during_an_outage_is_written_when_it_ends(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async def reports_twice(ctx: JobContext) -> None:
        await trio.sleep(5)
        await ctx.report_progress({"p": 1}, save_now=True)
        await ctx.report_progress({"p": 2}, save_now=True)
        await trio.sleep_forever()

    store = locked_store(tmp_path / "jobs.db")
    job_id = await store.submit("k")
    async with serving(make_worker(store, {"k": reports_twice})):
        await trio.sleep(1)
        with write_lock(tmp_path / "jobs.db"):
            await trio.sleep(9)
            assert (await store.get(job_id)).progress is None
        # Retries wait 2 s at most: by then the store is back for the worker.
        await trio.sleep(2)
        job = await store.get(job_id)
        # The last progress reported wins; the heartbeat is when it was written.
        assert (job.state, job.progress) == (S.RUNNING, {"p": 2})
        assert job.last_heartbeat_at is not None
        assert 10 <= job.last_heartbeat_at <= 12


async def test_a_shutdown_during_an_outage_ends_with_the_grace(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = locked_store(tmp_path / "jobs.db")
    job_id = await store.submit("stubborn")
    worker = make_worker(store, {"stubborn": stubborn}, grace=3)
    sender, receiver = open_inbox()
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.serve, receiver)
        await trio.sleep(1)
        lock = write_lock(tmp_path / "jobs.db")
        lock.__enter__()
        t0 = trio.current_time()
        sender.stop()
    assert trio.current_time() - t0 == 3
    lock.__exit__(None, None, None)
    # Left running for the lease rescue, as the log says.
    assert (await store.get(job_id)).state is S.RUNNING
    assert (
        "worker w1: the store stayed away until the end of its grace; "
        f"jobs left for the lease rescue: {job_id}"
    ) in [r.getMessage() for r in caplog.records]


async def test_an_outage_degrades_the_lifecycle_with_its_reason_and_recovers(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store = locked_store(tmp_path / "jobs.db")
    lifecycle = lifecycle_in(LifecycleState.READY)
    access = StoreAccess(store, "worker w1", lifecycle)
    async with trio.open_nursery() as nursery:
        with write_lock(tmp_path / "jobs.db"):
            nursery.start_soon(access.call, "submitting", lambda: store.submit("k"))
            await trio.testing.wait_all_tasks_blocked()
            assert access.down
            assert lifecycle.state is LifecycleState.DEGRADED
            assert lifecycle.reason == (
                "worker w1: job store unreachable (submitting: database is locked)"
            )
    assert not access.down
    assert lifecycle.state is LifecycleState.READY
    assert lifecycle.reason.startswith("worker w1: job store back after ")


async def test_recovering_leaves_a_degradation_that_is_not_its_own(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store = locked_store(tmp_path / "jobs.db")
    lifecycle = lifecycle_in(LifecycleState.READY)
    access = StoreAccess(store, "worker w1", lifecycle)
    async with trio.open_nursery() as nursery:
        with write_lock(tmp_path / "jobs.db"):
            nursery.start_soon(access.call, "submitting", lambda: store.submit("k"))
            await trio.testing.wait_all_tasks_blocked()
            lifecycle.degrade("the cache is down")
    assert lifecycle.state is LifecycleState.DEGRADED
    assert lifecycle.reason == "the cache is down"


async def test_a_bug_is_raised_not_retried(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store = locked_store(tmp_path / "jobs.db")
    access = StoreAccess(store, "worker w1")

    async def broken() -> None:
        store._db.execute("SELECT * FROM no_such_table")  # pyright: ignore[reportPrivateUsage]

    with pytest.raises(
        sqlite3.OperationalError, match=r"^no such table: no_such_table$"
    ):
        await access.call("reading", broken)
    assert not access.down


async def test_a_new_process_under_the_same_id_takes_over_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = support.mock_store()
    job_id = await store.submit("stubborn")
    old = make_worker(store, {"stubborn": stubborn}, lease=30)
    new = make_worker(store, {"stubborn": stubborn}, lease=30)
    with pytest.RaisesGroup(
        pytest.RaisesExc(
            WorkerReplacedError,
            match=(
                r"^worker id 'w1' was taken over by another process \(incarnation "
                rf"{new.incarnation}\); this one \({old.incarnation}\) stops$"
            ),
        ),
        flatten_subgroups=True,
    ):
        async with serving(old):
            await wait_for_state(store, job_id, S.RUNNING)
            t0 = trio.current_time()
            async with serving(new):
                await trio.testing.wait_all_tasks_blocked()
                # Not after the old lease expires: at the new one's start.
                assert trio.current_time() == t0
                job = await store.get(job_id)
                assert (job.state, job.attempts) == (S.RUNNING, 2)
                await trio.sleep(30)
    reasons = [e.reason for e in await store.events(job_id)]
    assert reasons[2] == "worker 'w1' was restarted (a new process took its id)"


async def test_a_deleted_store_file_stops_the_worker_naming_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = tmp_path / "jobs.db"
    store = locked_store(path)
    await store.submit("steps", {"steps": 100})
    worker = make_worker(store, {"steps": steps}, heartbeat_interval=1)
    message = (
        f"store file '{path}' was deleted or replaced under the worker "
        "(No such file or directory)"
    )
    with pytest.RaisesGroup(
        pytest.RaisesExc(StoreGoneError, match=f"^{re.escape(message)}$"),
        flatten_subgroups=True,
    ):
        async with serving(worker):
            await trio.sleep(2.5)
            path.unlink()
            t0 = trio.current_time()
            await trio.sleep(10)
    assert trio.current_time() - t0 <= 1


def test_a_replaced_store_file_is_noticed(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    with open_store(f"sqlite:///{path}") as store:
        (tmp_path / "new.db").write_bytes(path.read_bytes())
        (tmp_path / "new.db").replace(path)
        with pytest.raises(StoreGoneError, match="another file is at its path now"):
            store.check()


async def test_strays_of_a_lost_claim_are_queued_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = support.mock_store()
    kept, stray = await store.submit("k"), await store.submit("k")
    await store.claim("w1", lease=10)
    await store.claim("w1", lease=10)
    [released] = await store.release_strays("w1", held=[kept])
    assert (released.id, released.state, released.handbacks) == (stray, S.QUEUED, 1)
    assert (await store.get(kept)).state is S.RUNNING


def test_attempt_table_moves_and_refuses() -> None:
    job = support_job()
    for (source, event), target in ATTEMPT_TRANSITIONS.items():
        attempt = Attempt(job, state=source)
        assert attempt.apply(event) is target
    attempt = Attempt(job, state=AttemptState.ENDED)
    with pytest.raises(
        IllegalAttemptTransitionError,
        match=(
            r"^job j: an attempt cannot end while ended; that is legal only while "
            r"running or cancelling or draining or draining, cancel requested or "
            r"timing out or lost$"
        ),
    ):
        attempt.apply(AttemptEvent.END)
    assert attempt.state is AttemptState.ENDED


def support_job() -> Any:
    from trio_graceful.jobs import JobRecord

    return JobRecord(
        id="j", kind="k", payload={}, state=S.RUNNING, attempts=1, handbacks=0,
        max_attempts=3, timeout=None, worker="w", created_at=0, started_at=0,
        ended_at=None, last_heartbeat_at=None, progress=None,
        cancel_requested_at=None, timed_out_at=None, elapsed=None, error=None,
        result=None, failed_subtasks=(), stale_after=None, queued_at=None,
        traceback=None,
    )  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(
    durations=st.lists(st.integers(1, 8), min_size=1, max_size=6),
    outages=st.lists(
        st.tuples(st.integers(0, 20), st.integers(1, 15)), min_size=1, max_size=4
    ),
)
def test_random_outages_never_fail_a_job(
    tmp_path_factory: pytest.TempPathFactory,
    durations: list[int],
    outages: list[tuple[int, int]],
) -> None:
    path = tmp_path_factory.mktemp("outages") / "jobs.db"

    async def main() -> None:
        store = locked_store(path)
        ids = [await store.submit("steps", {"steps": d}) for d in durations]
        worker = make_worker(store, {"steps": steps}, concurrency=2)
        async with serving(worker):
            for pause, length in outages:
                await trio.sleep(pause)
                with write_lock(path):
                    await trio.sleep(length)
            await wait_all_in_state(store, ids, S.COMPLETED)
        for job_id, steps_count in zip(ids, durations, strict=True):
            job = await store.get(job_id)
            assert (job.result, job.progress) == (steps_count, {"step": steps_count})
            history = await store.events(job_id)
            # Every step of every history is a transition of the table.
            state = None
            for event in history:
                assert event.source == state
                if state is not None:
                    assert event.target in {
                        t for (s, _), t in TRANSITIONS.items() if s is state
                    }
                state = event.target
            assert [e.target for e in history][-1] is S.COMPLETED
            assert sum(e.target.terminal for e in history) == 1

    try:
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        while support.opened:
            support.opened.pop().close()


def test_a_worker_under_the_runner_degrades_the_program(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    seen: list[tuple[LifecycleState, str]] = []

    async def main() -> None:
        lifecycle = trio_graceful.current_runner().lifecycle
        store = locked_store(path)
        await store.submit("steps", {"steps": 3})
        worker = make_worker(store, {"steps": steps})
        await trio_graceful.current_runner().start_service(worker.serve)
        await trio.sleep(1.5)
        with write_lock(path):
            await trio.sleep(5)
            seen.append((lifecycle.state, lifecycle.reason))
        await trio.sleep(5)
        seen.append((lifecycle.state, lifecycle.reason))

    clock = trio.testing.MockClock(autojump_threshold=0)
    assert trio_graceful.run(main, clock=clock) == 0
    [(during, why), (after, why_after)] = seen
    assert during is LifecycleState.DEGRADED
    assert re.fullmatch(
        r"worker w1: job store unreachable \(.+: database is locked\)", why
    )
    assert after is LifecycleState.READY
    assert why_after.startswith("worker w1: job store back after ")


class TripCountingStore(JobStore):
    """A store that records what each trip to the database ran."""

    trips: list[str]

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.trips.append(fn.__name__)
        return await super()._call(fn, *args, **kwargs)

    async def _end(self, ending: Any, claim: Any) -> Any:
        # Endings go through the group commits, not _call.
        self.trips.append("finish" if claim is None else "finish_then_claim")
        return await super()._end(ending, claim)


def counting_store() -> TripCountingStore:
    db = support.mock_store()._db  # pyright: ignore[reportPrivateUsage]
    store = TripCountingStore(db, trio.current_time, False)
    store.trips = []
    return store


async def noop(ctx: JobContext) -> None:
    await trio.sleep(1)


async def test_free_slots_are_filled_by_one_claim(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = counting_store()
    ids = [await store.submit("noop") for _ in range(5)]
    worker = make_worker(store, {"noop": noop}, concurrency=4)
    async with serving(worker):
        await trio.testing.wait_all_tasks_blocked()
        assert worker.statistics().running == 4
        assert store.trips.count("claim_many") == 1
        await wait_all_in_state(store, ids, S.COMPLETED)


async def test_a_settlement_claims_the_next_job_in_the_same_trip(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = counting_store()
    ids = [await store.submit("noop") for _ in range(3)]
    worker = make_worker(store, {"noop": noop}, concurrency=1)
    async with serving(worker):
        await wait_all_in_state(store, ids, S.COMPLETED)
    trips = [t for t in store.trips if t in ("claim_many", "finish_then_claim")]
    # The first claim, then each ending claims the next (the last finds none).
    assert trips[:4] == ["claim_many"] + ["finish_then_claim"] * 3
    assert "finish" not in store.trips[: store.trips.index("drop_lease")]
    runs = [(await store.get(i)).started_at for i in ids]
    assert runs == [0, 1, 2]


@pytest.mark.parametrize("query", ["busy_timeout=soon", "busy_timeout=-1", "wal=1"])
def test_a_bad_sqlite_url_option_is_refused(tmp_path: Path, query: str) -> None:
    with pytest.raises(
        ValueError,
        match=(
            r"^the only option of a SQLite store URL is busy_timeout=SECONDS "
            rf"\(a finite number >= 0\), not '{query}'$"
        ),
    ):
        open_store(f"sqlite:///{tmp_path}/jobs.db?{query}")
    assert not (tmp_path / "jobs.db").exists()  # refused before anything changed


@pytest.mark.realtime
def test_the_busy_timeout_is_how_long_a_statement_waits(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    with open_store(f"sqlite:///{path}?busy_timeout=0.5") as store, write_lock(path):
        db = store._db  # pyright: ignore[reportPrivateUsage]
        t0 = time.monotonic()
        with pytest.raises(sqlite3.OperationalError) as raised:
            _leases.renew_lease(db, "w", now=0, lease=1)
        assert 0.5 <= time.monotonic() - t0 < 30
        assert store.is_outage(raised.value)


@pytest.mark.realtime
def test_a_statement_waits_for_the_lock_and_goes_on_once_it_is_free(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs.db"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    with open_store(f"sqlite:///{path}?busy_timeout=30") as store:
        db = store._db  # pyright: ignore[reportPrivateUsage]
        other.execute("BEGIN EXCLUSIVE")
        t0 = time.monotonic()
        release = threading.Timer(0.3, lambda: other.execute("COMMIT"))
        release.start()
        try:
            _leases.renew_lease(db, "w", now=0, lease=1)  # waits, then writes
        finally:
            release.join()
            other.close()
        assert time.monotonic() - t0 >= 0.3
        assert _leases.leases(db) == {"w": 1}


def test_with_no_busy_timeout_a_locked_file_is_an_outage_at_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs.db"
    with open_store(f"sqlite:///{path}?busy_timeout=0") as store, write_lock(path):
        db = store._db  # pyright: ignore[reportPrivateUsage]
        with pytest.raises(sqlite3.OperationalError, match="database is locked") as e:
            _leases.renew_lease(db, "w", now=0, lease=1)
        assert store.is_outage(e.value)


def test_which_postgres_errors_are_outages(postgres_url: str, tmp_path: Path) -> None:
    import psycopg

    with open_store(postgres_url) as store:
        db = store._db  # pyright: ignore[reportPrivateUsage]
        with pytest.raises(psycopg.Error) as bug:
            db.execute("SELEKT 1")
        assert not store.is_outage(bug.value)
        with pytest.raises(psycopg.OperationalError) as refused:
            psycopg.connect(f"postgresql://postgres@/postgres?host={tmp_path}")
        assert store.is_outage(refused.value)
        assert not store.is_outage(sqlite3.OperationalError("database is locked"))
