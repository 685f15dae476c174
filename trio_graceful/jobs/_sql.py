"""The job store's queries, written once for every SQL database.

Every operation runs in one transaction that takes the locks it needs
before it reads, so that two workers cannot claim one job and a transition
and its audit row are committed together or not at all. A dialect
(`SQLiteQueries`, `PostgresQueries`) supplies the connection, how a
transaction begins, how a claim locks its row, and whose clock is "now".

`JobStore` calls these methods from a worker thread, one at a time.
"""

from __future__ import annotations

import abc
import json
import uuid
from collections.abc import Generator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from ._leases import LeaseQueries
from ._records import AuditEvent, JobRecord
from ._states import JobEvent, JobNotFoundError, JobState, check_transition

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
    expires_at {real} NOT NULL,
    incarnation TEXT NOT NULL
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


class SqlQueries(LeaseQueries):
    """The store's operations, over a dialect's `_execute`; calls must not overlap."""

    #: The column that orders jobs submitted in the same instant.
    order_column = "id"
    #: Appended to the SELECT that picks rows to claim or rescue: rows
    #: another transaction holds are skipped, not waited for.
    lock_rows = ""
    #: Appended to the SELECT of a row about to change.
    lock_row = ""
    #: Whether `wait_for_news` hears other processes (else workers poll).
    listens = False

    @abc.abstractmethod
    def _execute(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement (``?`` placeholders); return its rows, if any."""

    @abc.abstractmethod
    def _begin(self) -> None:
        """Begin a transaction that serializes with other writers' claims."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection."""

    @abc.abstractmethod
    def is_outage(self, exc: BaseException) -> bool:
        """True if ``exc`` means the store is away for now, not a bug (`_outages`)."""

    @abc.abstractmethod
    def _rollback(self) -> None:
        """End the failed transaction, if the connection still has one."""

    def check(self) -> None:
        """Raise `StoreGoneError` if the store is no longer where it was opened."""

    def _now(self, now: float) -> float:
        """The time to record: the caller's clock unless the database keeps its own."""
        return now

    def _notify(self, news: str) -> None:
        """Tell listening workers about a new job or a cancel request."""
        del news  # nobody listens; workers poll

    def wait_for_news(self, timeout: float) -> None:
        """Block until another process notifies, or ``timeout`` seconds pass."""
        raise NotImplementedError("this store does not listen; poll instead")

    @contextmanager
    def _transaction(self) -> Generator[None, None, None]:
        self._begin()
        try:
            yield
        except BaseException:
            self._rollback()
            raise
        self._execute("COMMIT")

    def _select(self, where: str, args: Sequence[Any]) -> list[JobRecord]:
        rows = self._execute(
            f"SELECT {_COLUMNS} FROM jobs WHERE {where} ORDER BY id{self.lock_rows}",
            args,
        )
        return [_record(row) for row in rows]

    def _get(self, job_id: str, *, lock: bool = False) -> JobRecord:
        rows = self._execute(
            f"SELECT {_COLUMNS} FROM jobs WHERE id = ?"
            + (self.lock_row if lock else ""),
            (job_id,),
        )
        if not rows:
            raise JobNotFoundError(f"no job with id {job_id!r}")
        return _record(rows[0])

    def _write(
        self,
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
        self._execute(
            f"UPDATE jobs SET {assignments} WHERE id = ?", (*columns.values(), job.id)
        )
        self._execute(
            "INSERT INTO job_events (job, source, target, at, worker, reason) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (job.id, job.state.value, target.value, now, worker, reason),
        )
        return self._get(job.id)

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
        with self._transaction():
            now = self._now(now)
            self._execute(
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
            self._execute(
                "INSERT INTO job_events (job, source, target, at, worker, reason) "
                "VALUES (?, NULL, ?, ?, NULL, 'submitted')",
                (job_id, JobState.QUEUED.value, now),
            )
            self._notify("submitted")
        return job_id

    def claim(
        self,
        worker: str,
        *,
        now: float,
        lease: float,
        stale_after: float | None,
        incarnation: str | None = None,
    ) -> JobRecord | None:
        jobs = self.claim_many(
            worker,
            now=now,
            lease=lease,
            stale_after=stale_after,
            incarnation=incarnation,
            limit=1,
        )
        return jobs[0] if jobs else None

    def claim_many(
        self,
        worker: str,
        *,
        now: float,
        lease: float,
        stale_after: float | None,
        incarnation: str | None = None,
        limit: int,
    ) -> list[JobRecord]:
        """Claim up to ``limit`` of the oldest queued jobs, in one transaction."""
        with self._transaction():
            now = self._now(now)
            self._renew(worker, now + lease, incarnation=incarnation)
            rows = self._execute(
                f"SELECT {_COLUMNS} FROM jobs WHERE state = ? "
                f"ORDER BY created_at, {self.order_column} LIMIT ?{self.lock_rows}",
                (JobState.QUEUED.value, limit),
            )
            return [
                self._write(
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
                for job in map(_record, rows)
            ]

    def _owned(self, job_id: str, worker: str, attempt: int) -> JobRecord:
        job = self._get(job_id, lock=True)
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
        with self._transaction():
            now = self._now(now)
            job = self._get(job_id, lock=True)
            check_transition(job_id, job.state, event)
            job = self._owned(job_id, worker, attempt)
            if event is JobEvent.REQUEUE:
                # A hand-back at shutdown is not a failed attempt.
                changes = {**changes, "handbacks": job.handbacks + 1}
            if event is JobEvent.TIME_OUT:
                changes = {**changes, "timed_out_at": now}
            return self._write(
                job, event, now=now, worker=worker, reason=reason, changes=changes
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
        with self._transaction():
            now = self._now(now)
            if self._owned(job_id, worker, attempt).state is not JobState.RUNNING:
                return  # a late write of progress never changes an ending
            self._execute(
                "UPDATE jobs SET progress = ?, last_heartbeat_at = ? WHERE id = ?",
                (json.dumps(dict(progress)), now, job_id),
            )

    def request_cancel(self, job_id: str, *, now: float) -> JobRecord:
        with self._transaction():
            now = self._now(now)
            job = self._get(job_id, lock=True)
            if job.state is JobState.QUEUED:
                return self._write(
                    job,
                    JobEvent.CANCEL,
                    now=now,
                    worker=None,
                    reason="cancel requested before it ran",
                    changes={"cancel_requested_at": now, "error": "cancelled"},
                )
            if job.cancel_requested_at is None and not job.state.terminal:
                self._execute(
                    "UPDATE jobs SET cancel_requested_at = ? WHERE id = ?",
                    (now, job_id),
                )
                self._notify(f"cancel {job_id}")
            return self._get(job_id)

    def cancel_requests(self, worker: str) -> list[str]:
        rows = self._execute(
            "SELECT id FROM jobs WHERE worker = ? AND state = ? "
            "AND cancel_requested_at IS NOT NULL ORDER BY id",
            (worker, JobState.RUNNING.value),
        )
        return [row[0] for row in rows]

    def get(self, job_id: str) -> JobRecord:
        return self._get(job_id)

    def jobs(self, ids: Sequence[str] | None) -> list[JobRecord]:
        if ids is None:
            rows = self._execute(
                f"SELECT {_COLUMNS} FROM jobs ORDER BY created_at, {self.order_column}"
            )
            return [_record(row) for row in rows]
        return [self._get(job_id) for job_id in ids]

    def events(self, job_id: str | None) -> list[AuditEvent]:
        query = "SELECT seq, job, source, target, at, worker, reason FROM job_events"
        args: tuple[str, ...] = ()
        if job_id is not None:
            query += " WHERE job = ?"
            args = (job_id,)
        rows = self._execute(query + " ORDER BY seq", args)
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
