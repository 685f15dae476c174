"""Real faults under the worker processes of examples/jobs_service.py.

A PostgreSQL server restarted and stopped, a SQLite file locked by another
process past the busy timeout, made immutable, or deleted with its
directory, and a worker SIGKILLed and restarted twenty times under one id.
Each test checks that every job completed exactly once with all its steps
(the store's audit log and the example's audit file), that none failed
because of the store, and that the workers are alive (or, for the deleted
file, stopped with an error naming it). Bounds are generous: nothing here
asserts how fast the machine is.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.examples.test_jobs_service import PATIENCE, Service, stop_all
from tests.support.job_faults import (
    assert_each_completed_once,
    log_of,
    own_postgres,
    submit_many,
    wait_all_ended,
)
from trio_graceful.jobs import JobRecord, JobState, StoreError, _client, open_store

# Real processes and servers through several waits of up to a minute each
# (PATIENCE): the whole of one test may take longer than the default timeout
# on a loaded machine without anything being wrong.
pytestmark = [pytest.mark.realtime, pytest.mark.timeout(600)]

S = JobState


def outages_logged(service: Service, worker_id: str) -> list[float]:
    """How long each outage that the worker logged lasted, in seconds."""
    text = log_of(service, worker_id)
    return [float(s) for s in re.findall(r"job store back after ([0-9.]+) s", text)]


def started(service: Service, *worker_ids: str) -> None:
    for worker_id in worker_ids:
        service.wait(f"{worker_id} to start", lambda w=worker_id: w in service.leases())


def test_sqlite_locked_past_the_busy_timeout(tmp_path: Path) -> None:
    service = Service(tmp_path, f"sqlite:///{tmp_path}/jobs.db?busy_timeout=1")
    try:
        ids = submit_many(service.url, 30, steps=6, step_ms=100)
        workers = [service.start_worker(w, "--concurrency", "3") for w in ("A", "B")]
        started(service, "A", "B")
        service.wait("some progress", lambda: service.step(ids[0]) >= 2)
        other = sqlite3.connect(tmp_path / "jobs.db", isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        time.sleep(4)  # four busy timeouts
        other.execute("COMMIT")
        other.close()
        wait_all_ended(service, ids)
        assert_each_completed_once(service, ids, 6)
        assert [w.poll() for w in workers] == [None, None]
        # The outage outlasted the busy timeout, and the workers outlasted it.
        assert max(outages_logged(service, "A") + outages_logged(service, "B")) >= 1
        assert [service.stop(w) for w in workers] == [0, 0]
    finally:
        stop_all(service)


def _chattr(flag: str, *paths: Path) -> bool:
    done = subprocess.run(
        ["chattr", flag, *map(str, paths)], capture_output=True, check=False
    )
    return done.returncode == 0


def test_sqlite_file_made_read_only(tmp_path: Path) -> None:
    # Root writes through chmod, so the file is made immutable instead: even
    # writes through descriptors opened before fail (EPERM -> disk I/O error).
    # The -shm file stays writable: SQLite maps it into memory.
    db = tmp_path / "jobs.db"
    service = Service(tmp_path)
    files = (db, tmp_path / "jobs.db-wal")
    try:
        ids = submit_many(service.url, 30, steps=6, step_ms=100)
        workers = [service.start_worker(w, "--concurrency", "3") for w in ("A", "B")]
        started(service, "A", "B")
        service.wait("some progress", lambda: service.step(ids[0]) >= 2)
        if not _chattr("+i", *files):
            pytest.skip("chattr +i is not allowed here")
        time.sleep(3)
        assert _chattr("-i", *files)
        wait_all_ended(service, ids)
        assert_each_completed_once(service, ids, 6)
        assert [w.poll() for w in workers] == [None, None]
        assert outages_logged(service, "A") or outages_logged(service, "B")
        assert [service.stop(w) for w in workers] == [0, 0]
    finally:
        _chattr("-i", *files)
        stop_all(service)


def test_deleted_store_directory_stops_the_workers(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    service = Service(tmp_path, f"sqlite:///{store_dir}/jobs.db")
    try:
        submit_many(service.url, 30, steps=50, step_ms=100)
        workers = [service.start_worker(w) for w in ("A", "B")]
        started(service, "A", "B")
        shutil.rmtree(store_dir)
        t0 = time.monotonic()
        codes = [w.wait(timeout=PATIENCE) for w in workers]
        # The heartbeat interval is 1 s; the rest is the process's shutdown.
        assert time.monotonic() - t0 < PATIENCE
        assert codes == [1, 1]
        for worker_id in ("A", "B"):
            assert (
                f"store file '{store_dir}/jobs.db' was deleted or replaced under "
                "the worker (No such file or directory)"
            ) in log_of(service, worker_id)
    finally:
        stop_all(service)


def test_sigkilled_and_restarted_twenty_times_under_one_id(tmp_path: Path) -> None:
    service = Service(tmp_path)
    try:
        # Kills count against max_attempts: give each job room for all of them.
        ids = submit_many(service.url, 20, steps=10, step_ms=50, attempts=30)
        for _ in range(20):
            # The default lease (30 s): only the take-over frees the jobs.
            worker = service.start_worker("W", "--concurrency", "4")
            service.wait(
                "W to run jobs",
                lambda: any(
                    j.worker == "W" and j.state.value == "running"
                    for j in service_jobs(service, ids)
                ),
            )
            time.sleep(0.2)
            worker.send_signal(signal.SIGKILL)
            worker.wait()
        last = service.start_worker("W", "--concurrency", "4")
        wait_all_ended(service, ids)
        assert_each_completed_once(service, ids, 10)
        assert last.poll() is None
        assert service.stop(last) == 0
    finally:
        stop_all(service)


def service_jobs(service: Service, ids: list[str]) -> list[JobRecord]:
    q = service.queries()
    try:
        return list(_client.jobs(q, ids))
    finally:
        q.close()


def test_postgres_restarted_and_stopped_under_running_workers(tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    with own_postgres() as server:
        service = Service(tmp_path, server.url)
        try:
            ids = submit_many(service.url, 40, steps=8, step_ms=100)
            workers = [
                service.start_worker(w, "--concurrency", "3") for w in ("A", "B")
            ]
            started(service, "A", "B")
            service.wait("some progress", lambda: service.step(ids[0]) >= 2)
            server.ctl("-m", "fast", "restart")
            service.wait("more progress", lambda: service.step(ids[-1]) >= 1)
            server.ctl("-m", "fast", "stop")
            time.sleep(3)
            server.ctl("start")
            wait_all_ended(service, ids)
            assert_each_completed_once(service, ids, 8)
            assert [w.poll() for w in workers] == [None, None]
            assert len(outages_logged(service, "A")) >= 2
            assert [service.stop(w) for w in workers] == [0, 0]
        finally:
            stop_all(service)


def test_a_server_that_never_answers_is_given_up_on(tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    # Accepts the connection (the kernel does) and never says a word.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(StoreError, match=r"^cannot connect to the PostgreSQL"):
            open_store(f"postgresql://postgres@127.0.0.1:{port}/jobs")
        # The connect timeout is 5 s (libpq may try twice: with and without SSL).
        assert time.monotonic() - t0 < PATIENCE


def test_postgres_down_at_the_shutdown_leaves_jobs_for_the_rescue(
    tmp_path: Path,
) -> None:
    pytest.importorskip("psycopg")
    with own_postgres() as server:
        service = Service(tmp_path, server.url)
        try:
            ids = submit_many(service.url, 6, steps=40, step_ms=100)
            first = service.start_worker("A", "--lease", "2", "--grace", "1")
            started(service, "A")
            service.wait("some progress", lambda: service.step(ids[0]) >= 2)
            server.ctl("-m", "fast", "stop")
            t0 = time.monotonic()
            first.send_signal(signal.SIGTERM)
            # Bounded by the grace, not by the store: well before it is back.
            assert first.wait(timeout=PATIENCE) == 0
            assert time.monotonic() - t0 < PATIENCE
            server.ctl("start")
            left = re.search(
                r"jobs left for the lease rescue: (.*)", log_of(service, "A")
            )
            assert left is not None
            assert set(left.group(1).split(", ")) <= set(ids)
            second = service.start_worker("B", "--concurrency", "6")
            wait_all_ended(service, ids)
            assert_each_completed_once(service, ids, 40)
            assert service.stop(second) == 0
        finally:
            stop_all(service)


def rescues_logged(service: Service, *worker_ids: str) -> list[tuple[str, str]]:
    """The (job, attempt) of each rescue that the workers logged."""
    return [
        found
        for worker_id in worker_ids
        for found in re.findall(
            r"rescued job (\w+) \(attempt (\d+) of", log_of(service, worker_id)
        )
    ]


def test_postgres_stopped_for_longer_than_the_lease_under_two_workers(
    tmp_path: Path,
) -> None:
    # W1 stalls through the outage too (SIGSTOP), so that W2 is the one to
    # rescue its jobs; W1 finds them taken when it goes on.
    pytest.importorskip("psycopg")
    with own_postgres() as server:
        service = Service(tmp_path, server.url)
        try:
            ids = submit_many(service.url, 12, steps=30, step_ms=100)
            options = ("--concurrency", "3", "--lease", "2")
            w1, w2 = [service.start_worker(w, *options) for w in ("W1", "W2")]
            started(service, "W1", "W2")
            service.wait("some progress", lambda: service.step(ids[0]) >= 2)
            # W1 may start after W2 has claimed its fill: wait for W1's own.
            service.wait(
                "W1 to run jobs",
                lambda: any(
                    job.worker == "W1" and job.state is S.RUNNING
                    for job in service_jobs(service, ids)
                ),
            )
            w1.send_signal(signal.SIGSTOP)
            held = {
                job.id: job.attempts
                for job in service_jobs(service, ids)
                if job.worker == "W1" and not job.state.terminal
            }
            server.ctl("-m", "fast", "stop")
            time.sleep(5.3)
            server.ctl("start")
            service.wait(
                "W2 to rescue the jobs of W1",
                lambda: all(
                    (job.worker, job.attempts) != ("W1", held[job.id])
                    or job.state is S.QUEUED
                    for job in service_jobs(service, list(held))
                ),
            )
            w1.send_signal(signal.SIGCONT)
            wait_all_ended(service, ids)
            assert [w1.poll(), w2.poll()] == [None, None]
            assert_each_completed_once(service, ids, 30, stopped=held)
            log = log_of(service, "W1")
            assert held
            for job_id, attempt in held.items():
                # Named with its new owner: a later attempt, or the rescuer.
                assert re.search(
                    rf"WARNING trio_graceful.jobs: worker W1: job {job_id} attempt "
                    rf"{attempt} no longer belongs to worker 'W1'; it is \w+"
                    r"( on attempt \d+ of worker 'W[12]'|, set by worker 'W2'); "
                    r"its attempt was stopped",
                    log,
                ), log
            assert "Traceback" not in log
            rescues = rescues_logged(service, "W1", "W2")
            assert {(j, int(a)) for j, a in rescues} >= set(held.items())
            assert len(rescues) == len(set(rescues)), rescues
            assert [service.stop(w) for w in (w1, w2)] == [0, 0]
        finally:
            with contextlib.suppress(ProcessLookupError):
                for process in service.workers:
                    process.send_signal(signal.SIGCONT)
            stop_all(service)
