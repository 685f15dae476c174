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
from ._reads import ReadQueries
from ._records import JobRecord
from ._schema import COLUMNS, record
from ._states import JobEvent, JobState, check_transition


class StoreError(Exception):
    """The store cannot be opened or used (not a database, wrong schema, ...)."""


class LostJobError(RuntimeError):
    """A worker wrote to a job attempt that is no longer its own.

    A rescuer handed the job back after the worker's lease expired; the
    worker's write is refused and changes nothing.
    """


class SqlQueries(ReadQueries, LeaseQueries):
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
        kinds: Sequence[str] | None = None,
    ) -> JobRecord | None:
        jobs = self.claim_many(
            worker,
            now=now,
            lease=lease,
            stale_after=stale_after,
            incarnation=incarnation,
            kinds=kinds,
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
        kinds: Sequence[str] | None = None,
        limit: int,
    ) -> list[JobRecord]:
        """Claim up to ``limit`` of the oldest queued jobs of ``kinds`` (None: any).

        All in one transaction.
        """
        of_kinds = (
            "" if kinds is None else f" AND kind IN ({', '.join('?' * len(kinds))})"
        )
        with self._transaction():
            now = self._now(now)
            self._renew(worker, now + lease, incarnation=incarnation)
            rows = self._execute(
                f"SELECT {COLUMNS} FROM jobs WHERE state = ?{of_kinds} "
                f"ORDER BY created_at, {self.order_column} LIMIT ?{self.lock_rows}",
                (JobState.QUEUED.value, *(kinds or ()), limit),
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
                for job in map(record, rows)
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
        traceback: str | None = None,
    ) -> JobRecord:
        """A transition by the worker that holds the attempt, with its traceback."""
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
            if traceback is not None:
                self._execute(
                    "INSERT INTO job_tracebacks (job, traceback) VALUES (?, ?) "
                    "ON CONFLICT (job) DO UPDATE SET traceback = excluded.traceback",
                    (job_id, traceback),
                )
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
