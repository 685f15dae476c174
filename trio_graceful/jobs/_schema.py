"""The job store's tables, and how one of their rows becomes a `JobRecord`.

Tables and indexes are created with ``IF NOT EXISTS`` when a store is
opened, and never altered: a store made by an earlier release is used as it
is. So what later releases add lives in tables and indexes of its own
(``job_tracebacks``, ``job_incarnations``), or is derived from the audit
log (when a job became queued), never in a new column of ``jobs`` or
``job_workers``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from ._records import JobRecord
from ._states import JobState

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    handbacks INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    timeout {real},
    worker TEXT,
    created_at {real} NOT NULL,
    started_at {real},
    ended_at {real},
    last_heartbeat_at {real},
    progress TEXT,
    cancel_requested_at {real},
    timed_out_at {real},
    elapsed {real},
    error TEXT,
    result TEXT,
    failed_subtasks TEXT NOT NULL DEFAULT '[]',
    stale_after {real}
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, created_at);
CREATE TABLE IF NOT EXISTS job_events (
    seq {serial},
    job TEXT NOT NULL,
    source TEXT,
    target TEXT NOT NULL,
    at {real} NOT NULL,
    worker TEXT,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS job_workers (
    id TEXT PRIMARY KEY,
    expires_at {real} NOT NULL
);
CREATE INDEX IF NOT EXISTS job_events_by_job ON job_events (job, seq);
CREATE TABLE IF NOT EXISTS job_incarnations (
    id TEXT PRIMARY KEY,
    incarnation TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS job_tracebacks (
    job TEXT PRIMARY KEY,
    traceback TEXT NOT NULL
);
"""

#: The columns of ``jobs`` that a transition may set, as the SQL names them.
WRITABLE: Final = (
    "state",
    "attempts",
    "handbacks",
    "worker",
    "started_at",
    "ended_at",
    "progress",
    "cancel_requested_at",
    "timed_out_at",
    "elapsed",
    "error",
    "result",
    "failed_subtasks",
    "stale_after",
)

COLUMNS = (
    "id, kind, payload, state, attempts, handbacks, max_attempts, timeout, worker, "
    "created_at, started_at, ended_at, last_heartbeat_at, progress, "
    "cancel_requested_at, timed_out_at, elapsed, error, result, failed_subtasks, "
    "stale_after, "
    # When the job last became queued, from its audit rows.
    "(SELECT max(e.at) FROM job_events e WHERE e.job = jobs.id "
    f"AND e.target = '{JobState.QUEUED.value}'), "
    "(SELECT t.traceback FROM job_tracebacks t WHERE t.job = jobs.id)"
)


def _load(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def record(row: Sequence[Any]) -> JobRecord:
    return JobRecord(
        id=row[0],
        kind=row[1],
        payload=json.loads(row[2]),
        state=JobState(row[3]),
        attempts=row[4],
        handbacks=row[5],
        max_attempts=row[6],
        timeout=row[7],
        worker=row[8],
        created_at=row[9],
        started_at=row[10],
        ended_at=row[11],
        last_heartbeat_at=row[12],
        progress=_load(row[13]),
        cancel_requested_at=row[14],
        timed_out_at=row[15],
        elapsed=row[16],
        error=row[17],
        result=_load(row[18]),
        failed_subtasks=tuple(json.loads(row[19])),
        stale_after=row[20],
        queued_at=row[21] if JobState(row[3]) is JobState.QUEUED else None,
        traceback=row[22],
    )


# The columns of ``jobs`` that hold seconds: read back, they are floats.
_SECONDS: Final = frozenset(
    {
        "timeout",
        "created_at",
        "started_at",
        "ended_at",
        "last_heartbeat_at",
        "cancel_requested_at",
        "timed_out_at",
        "elapsed",
        "stale_after",
    }
)


def updated(job: JobRecord, columns: Mapping[str, Any], *, at: float) -> JobRecord:
    """``job`` as ``UPDATE jobs SET columns`` at ``at`` leaves it.

    As `record` would read the row back, without the query: ``job`` was read
    in the same transaction, with the row locked.
    """
    fields: dict[str, Any] = {}
    for name, value in columns.items():
        if name == "state":
            fields["state"] = state = JobState(value)
            # The audit row written with the change says when it was queued.
            fields["queued_at"] = at if state is JobState.QUEUED else None
        elif name in ("progress", "result"):
            fields[name] = _load(value)
        elif name == "failed_subtasks":
            fields[name] = tuple(json.loads(value))
        elif name in _SECONDS:
            fields[name] = None if value is None else float(value)
        else:
            fields[name] = value
    return attrs.evolve(job, **fields)
