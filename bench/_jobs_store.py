"""The job store as the jobs benchmarks set it up and watch it: queue, reset, count."""

from __future__ import annotations

import time

from trio_graceful.jobs import JobState, _client, open_store
from trio_graceful.jobs._sql import Database

TABLES = ("jobs", "job_events", "job_workers", "job_incarnations", "job_tracebacks")


def queries(url: str) -> Database:
    return open_store(url)._db  # pyright: ignore[reportPrivateUsage]


def reset(url: str) -> None:
    """Empty the store, so that every run starts from the same tables."""
    q = queries(url)
    if url.startswith("postgresql"):
        # DELETE would leave dead rows for every later run's scans to skip.
        q.execute(f"TRUNCATE {', '.join(TABLES)}")
    else:
        for table in TABLES:
            q.execute(f"DELETE FROM {table}")
    q.close()


def submit_many(url: str, n: int, kind: str = "noop") -> None:
    """Queue ``n`` jobs of ``kind``, without waiting for the disk.

    The queue is filled before the clock starts: its durability is not what
    is measured, and a flush per job would make the rounds minutes longer.
    """
    q = queries(url)
    if url.startswith("postgresql"):
        q.execute("SET synchronous_commit = off")  # this connection's only
    else:
        q.execute("PRAGMA synchronous = OFF")
    for _ in range(n):
        _client.submit(q, kind, {}, timeout=None, max_attempts=3, now=time.time())
    # The planner's statistics, as a running server's autovacuum keeps them:
    # a table just filled looks empty to it until then.
    q.execute("ANALYZE")
    q.close()


TERMINAL = [state.value for state in JobState if state.terminal]


def count_ended(q: Database) -> int:
    marks = ", ".join("?" * len(TERMINAL))
    rows = q.execute(f"SELECT count(*) FROM jobs WHERE state IN ({marks})", TERMINAL)
    return int(rows[0][0])
