"""A worker SIGKILLed between its jobs' ending and the commit of their group.

The test holds the store's write lock from a connection of its own (SQLite's
``BEGIN IMMEDIATE``; a table lock on PostgreSQL), lets the worker's jobs all
return, and kills the worker while their endings wait for the lock. Nothing
of the group may be committed; restarted under its id, the worker runs every
job of the group again, and each is completed once.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from trio_graceful.jobs import JobState, _client, open_store

pytestmark = [pytest.mark.realtime, pytest.mark.timeout(300)]

S = JobState
PATIENCE = 60.0
ROOT = Path(__file__).resolve().parents[2]


def wait(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.02)


def lines(audit: Path) -> list[dict[str, Any]]:
    if not audit.exists():
        return []
    return [json.loads(line) for line in audit.read_text().splitlines()]


def start_worker(url: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    args = [url, "W", "4", str(tmp_path / "audit.jsonl")]
    log = (tmp_path / "worker.log").open("ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.support.job_groups", *args],
            cwd=ROOT,
            stdout=log,
            stderr=log,
        )
    finally:
        log.close()


@contextmanager
def store_locked(url: str) -> Iterator[Callable[[], bool]]:
    """Hold the store's write lock; yield whether the worker waits for it."""
    if url.startswith("sqlite:///"):
        db = sqlite3.connect(url[len("sqlite:///") :], isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
        try:
            # SQLite cannot tell who waits for its lock.
            yield lambda: True
        finally:
            db.close()
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as db, psycopg.connect(url) as watch:
        watch.autocommit = True
        db.execute("BEGIN")
        db.execute("LOCK TABLE jobs IN EXCLUSIVE MODE")

        def waiting() -> bool:
            rows = watch.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchall()
            return bool(rows[0][0])

        try:
            yield waiting
        finally:
            db.execute("ROLLBACK")


def test_sigkill_before_a_groups_commit_runs_every_job_of_it_again(
    store_url: str, tmp_path: Path
) -> None:
    audit = tmp_path / "audit.jsonl"
    with open_store(store_url) as store:
        q = store._db  # pyright: ignore[reportPrivateUsage]
        ids = [
            _client.submit(q, "k", {}, timeout=None, max_attempts=3, now=time.time())
            for _ in range(4)
        ]
        worker = start_worker(store_url, tmp_path)
        try:
            wait("4 jobs to start", lambda: len(lines(audit)) == 4)
            with store_locked(store_url) as worker_waits:
                worker.send_signal(signal.SIGUSR1)  # the jobs return
                wait(
                    "4 jobs to return",
                    lambda: sum(x["event"] == "returned" for x in lines(audit)) == 4,
                )
                wait("the worker to wait for the lock", worker_waits)
                # Long enough for the four endings to reach the store's lock.
                time.sleep(0.5)
                worker.send_signal(signal.SIGKILL)
                worker.wait(timeout=PATIENCE)
            # None of the group was committed: none is reported done.
            for job in _client.jobs(q, ids):
                assert (job.state, job.worker, job.attempts) == (S.RUNNING, "W", 1)
            # Restarted under its id, the worker takes its jobs over at once.
            worker = start_worker(store_url, tmp_path)
            wait("4 jobs to start again", lambda: len(lines(audit)) == 12)
            worker.send_signal(signal.SIGUSR1)
            wait(
                "every job to end",
                lambda: all(job.state.terminal for job in _client.jobs(q, ids)),
            )
            for job in _client.jobs(q, ids):
                assert (job.state, job.result, job.attempts) == (S.COMPLETED, "done", 2)
                targets = [e.target for e in _client.events(q, job.id)]
                assert targets.count(S.COMPLETED) == 1, targets
            returned = sorted(
                (x["job"], x["attempt"])
                for x in lines(audit)
                if x["event"] == "returned"
            )
            assert returned == sorted((i, a) for i in ids for a in (1, 2))
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=PATIENCE) == 0, (
                tmp_path / "worker.log"
            ).read_text()
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
