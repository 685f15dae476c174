"""The SQLite job store's queries: synchronous, one connection, one transaction each.

Every method runs in one ``BEGIN IMMEDIATE`` transaction, which takes the
database's write lock at once: two processes sharing the file cannot both
claim a job, and a transition and its audit row are committed together or
not at all. The database runs in WAL mode with ``synchronous=FULL`` so a
committed transition survives a crash of the process or the machine.

`JobStore` calls these methods from a worker thread, one at a time.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Generator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from ._records import AuditEvent, JobRecord
from ._states import JobEvent, JobNotFoundError, JobState, check_transition

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    handbacks INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    timeout REAL,
    worker TEXT,
    created_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    last_heartbeat_at REAL,
    progress TEXT,
    cancel_requested_at REAL,
    timed_out_at REAL,
    elapsed REAL,
    error TEXT,
    result TEXT,
    failed_subtasks TEXT NOT NULL DEFAULT '[]',
    stale_after REAL
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, created_at);
CREATE TABLE IF NOT EXISTS job_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL,
    source TEXT,
    target TEXT NOT NULL,
    at REAL NOT NULL,
    worker TEXT,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS job_workers (
    id TEXT PRIMARY KEY,
    expires_at REAL NOT NULL
);
"""

_COLUMNS = (
    "id, kind, payload, state, attempts, handbacks, max_attempts, timeout, worker, "
    "created_at, started_at, ended_at, last_heartbeat_at, progress, "
    "cancel_requested_at, timed_out_at, elapsed, error, result, failed_subtasks, "
    "stale_after"
)


class StoreError(Exception):
    """The store cannot be opened or used (not a database, wrong schema, ...)."""


class LostJobError(RuntimeError):
    """A worker wrote to a job attempt that is no longer its own.

    A rescuer handed the job back after the worker's lease expired; the
    worker's write is refused and changes nothing.
    """


def _load(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _record(row: Sequence[Any]) -> JobRecord:
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
    )


class SQLiteQueries:
    """The store's operations on one SQLite connection; calls must not overlap."""

    def __init__(self, path: str) -> None:
        self._path = path
        try:
            # isolation_level=None: transactions are begun explicitly below.
            self._db = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=30
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            if hasattr(self, "_db"):
                self._db.close()
            raise StoreError(
                f"store file {path!r} is not a usable SQLite database: {exc}"
            ) from None

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _transaction(self) -> Generator[sqlite3.Connection, None, None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _get(self, db: sqlite3.Connection, job_id: str) -> JobRecord:
        row = db.execute(
            f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,)
        ).fetchone()
        if row is None:
            raise JobNotFoundError(f"no job with id {job_id!r}")
        return _record(row)

    def _write(
        self,
        db: sqlite3.Connection,
        job: JobRecord,
        event: JobEvent,
        *,
        now: float,
        worker: str | None,
        reason: str,
        changes: Mapping[str, Any],
    ) -> JobRecord:
        """Check ``event`` against the table, apply it and its audit row."""
        target = check_transition(job.id, job.state, event)
        columns = {"state": target.value, **changes}
        if target.terminal:
            columns["ended_at"] = now
        assignments = ", ".join(f"{name} = ?" for name in columns)
        db.execute(
            f"UPDATE jobs SET {assignments} WHERE id = ?", (*columns.values(), job.id)
        )
        db.execute(
            "INSERT INTO job_events (job, source, target, at, worker, reason) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (job.id, job.state.value, target.value, now, worker, reason),
        )
        return self._get(db, job.id)

    def submit(
        self,
        kind: str,
        payload: Mapping[str, Any],
        *,
        timeout: float | None,
        max_attempts: int,
        now: float,
    ) -> str:
        job_id = uuid.uuid4().hex
        with self._transaction() as db:
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
        return job_id

    def claim(
        self, worker: str, *, now: float, lease: float, stale_after: float | None
    ) -> JobRecord | None:
        with self._transaction() as db:
            self._renew(db, worker, now + lease)
            row = db.execute(
                f"SELECT {_COLUMNS} FROM jobs WHERE state = ? "
                "ORDER BY created_at, rowid LIMIT 1",
                (JobState.QUEUED.value,),
            ).fetchone()
            if row is None:
                return None
            job = _record(row)
            return self._write(
                db,
                job,
                JobEvent.CLAIM,
                now=now,
                worker=worker,
                reason=f"attempt {job.attempts + 1}",
                changes={
                    "attempts": job.attempts + 1,
                    "worker": worker,
                    "started_at": now,
                    "stale_after": stale_after,
                    "elapsed": None,
                },
            )

    def _owned(
        self, db: sqlite3.Connection, job_id: str, worker: str, attempt: int
    ) -> JobRecord:
        job = self._get(db, job_id)
        if job.worker != worker or job.attempts != attempt:
            raise LostJobError(
                f"job {job_id} attempt {attempt} no longer belongs to worker "
                f"{worker!r}; it is {job.state.value} on attempt {job.attempts} "
                f"of worker {job.worker!r}"
            )
        return job

    def finish(
        self,
        job_id: str,
        event: JobEvent,
        *,
        worker: str,
        attempt: int,
        now: float,
        reason: str,
        changes: Mapping[str, Any],
    ) -> JobRecord:
        """A transition by the worker that holds the attempt."""
        with self._transaction() as db:
            job = self._get(db, job_id)
            check_transition(job_id, job.state, event)
            job = self._owned(db, job_id, worker, attempt)
            if event is JobEvent.REQUEUE:
                # A hand-back at shutdown is not a failed attempt.
                changes = {**changes, "handbacks": job.handbacks + 1}
            return self._write(
                db,
                job,
                event,
                now=now,
                worker=worker,
                reason=reason,
                changes=changes,
            )

    def save_progress(
        self,
        job_id: str,
        progress: Mapping[str, Any],
        *,
        worker: str,
        attempt: int,
        now: float,
    ) -> None:
        with self._transaction() as db:
            self._owned(db, job_id, worker, attempt)
            db.execute(
                "UPDATE jobs SET progress = ?, last_heartbeat_at = ? WHERE id = ?",
                (json.dumps(dict(progress)), now, job_id),
            )

    def request_cancel(self, job_id: str, *, now: float) -> JobRecord:
        with self._transaction() as db:
            job = self._get(db, job_id)
            if job.state is JobState.QUEUED:
                return self._write(
                    db,
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
            return self._get(db, job_id)

    def cancel_requests(self, worker: str) -> list[str]:
        rows = self._db.execute(
            "SELECT id FROM jobs WHERE worker = ? AND state = ? "
            "AND cancel_requested_at IS NOT NULL ORDER BY id",
            (worker, JobState.RUNNING.value),
        ).fetchall()
        return [row[0] for row in rows]

    def _renew(self, db: sqlite3.Connection, worker: str, expires_at: float) -> None:
        db.execute(
            "INSERT INTO job_workers (id, expires_at) VALUES (?, ?) "
            "ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at",
            (worker, expires_at),
        )

    def renew_lease(self, worker: str, *, now: float, lease: float) -> None:
        with self._transaction() as db:
            self._renew(db, worker, now + lease)

    def drop_lease(self, worker: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM job_workers WHERE id = ?", (worker,))

    def leases(self) -> dict[str, float]:
        rows = self._db.execute("SELECT id, expires_at FROM job_workers ORDER BY id")
        return {row[0]: row[1] for row in rows.fetchall()}

    def rescue(self, *, now: float, rescuer: str) -> list[JobRecord]:
        """Settle the jobs of workers whose lease has expired; return them."""
        rescued: list[JobRecord] = []
        with self._transaction() as db:
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM jobs WHERE state IN (?, ?, ?) "
                "AND NOT EXISTS (SELECT 1 FROM job_workers w "
                "WHERE w.id = jobs.worker AND w.expires_at > ?) ORDER BY id",
                (
                    JobState.RUNNING.value,
                    JobState.CANCELLING.value,
                    JobState.TIMING_OUT.value,
                    now,
                ),
            ).fetchall()
            for row in rows:
                job = _record(row)
                why = f"worker {job.worker!r} is gone (its lease expired)"
                if (
                    job.state is JobState.RUNNING
                    and job.cancel_requested_at is not None
                ):
                    job = self._write(
                        db,
                        job,
                        JobEvent.CANCEL,
                        now=now,
                        worker=rescuer,
                        reason=why,
                        changes={},
                    )
                if job.state is JobState.CANCELLING:
                    event, changes = JobEvent.FINISH_CANCEL, {"error": "cancelled"}
                elif job.state is JobState.TIMING_OUT:
                    event, changes = JobEvent.FINISH_TIME_OUT, {}
                elif job.attempts - job.handbacks >= job.max_attempts:
                    event = JobEvent.FAIL
                    changes = {
                        "error": f"{why} on attempt {job.attempts}, "
                        f"the last of {job.max_attempts}"
                    }
                else:
                    event, changes = JobEvent.REQUEUE, {}
                rescued.append(
                    self._write(
                        db,
                        job,
                        event,
                        now=now,
                        worker=rescuer,
                        reason=why,
                        changes=changes,
                    )
                )
        return rescued

    def get(self, job_id: str) -> JobRecord:
        return self._get(self._db, job_id)

    def jobs(self, ids: Sequence[str] | None) -> list[JobRecord]:
        if ids is None:
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM jobs ORDER BY created_at, rowid"
            ).fetchall()
            return [_record(row) for row in rows]
        return [self._get(self._db, job_id) for job_id in ids]

    def events(self, job_id: str | None) -> list[AuditEvent]:
        query = "SELECT seq, job, source, target, at, worker, reason FROM job_events"
        args: tuple[str, ...] = ()
        if job_id is not None:
            query += " WHERE job = ?"
            args = (job_id,)
        rows = self._db.execute(query + " ORDER BY seq", args).fetchall()
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
