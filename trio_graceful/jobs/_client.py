"""What a client does with the job store: submit, ask to cancel, read.

Each operation is one transaction (`_sql`). Reads take no locks: a job's
record and its audit rows are read as last committed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ._records import AuditEvent, JobRecord
from ._schema import COLUMNS, record
from ._sql import Database
from ._states import JobEvent, JobState


def submit(
    db: Database,
    kind: str,
    payload: Mapping[str, Any],
    *,
    timeout: float | None,
    max_attempts: int,
    now: float,
) -> str:
    """Queue a new job; return its id."""
    job_id = uuid.uuid4().hex
    with db.transaction():
        now = db.now(now)
        db.execute(
            "INSERT INTO jobs (id, kind, payload, state, max_attempts, timeout, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                job_id,
                kind,
                json.dumps(dict(payload)),
                JobState.QUEUED.value,
                max_attempts,
                timeout,
                now,
            ),
        )
        db.execute(
            "INSERT INTO job_events (job, source, target, at, worker, reason) "
            "VALUES (?, NULL, ?, ?, NULL, 'submitted')",
            (job_id, JobState.QUEUED.value, now),
        )
        db.notify("submitted")
    return job_id


def request_cancel(db: Database, job_id: str, *, now: float) -> JobRecord:
    """Cancel a queued job, or record the request for a running one's worker."""
    with db.transaction():
        now = db.now(now)
        job = db.get(job_id, lock=True)
        if job.state is JobState.QUEUED:
            return db.write(
                job,
                JobEvent.CANCEL,
                now=now,
                worker=None,
                reason="cancel requested before it ran",
                changes={"cancel_requested_at": now, "error": "cancelled"},
            )
        if job.cancel_requested_at is None and not job.state.terminal:
            db.execute(
                "UPDATE jobs SET cancel_requested_at = ? WHERE id = ?",
                (now, job_id),
            )
            db.notify(f"cancel {job_id}")
        return db.get(job_id)


def jobs(db: Database, ids: Sequence[str] | None) -> list[JobRecord]:
    """The records of ``ids`` in that order, or of all jobs, oldest first."""
    if ids is None:
        rows = db.execute(
            f"SELECT {COLUMNS} FROM jobs ORDER BY created_at, {db.dialect.order_column}"
        )
        return [record(row) for row in rows]
    return [db.get(job_id) for job_id in ids]


def events(db: Database, job_id: str | None) -> list[AuditEvent]:
    """The audit rows of ``job_id``, or of every job, oldest first."""
    query = "SELECT seq, job, source, target, at, worker, reason FROM job_events"
    args: tuple[str, ...] = ()
    if job_id is not None:
        query += " WHERE job = ?"
        args = (job_id,)
    rows = db.execute(query + " ORDER BY seq", args)
    if job_id is not None and not rows:
        db.get(job_id)  # every job has its submission's row
    return [
        AuditEvent(
            seq=row[0],
            job=row[1],
            source=None if row[2] is None else JobState(row[2]),
            target=JobState(row[3]),
            at=row[4],
            worker=row[5],
            reason=row[6],
        )
        for row in rows
    ]
