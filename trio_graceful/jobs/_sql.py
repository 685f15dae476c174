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

from ._exceptions import LostJobError
from ._holding import HoldingQueries
from ._records import JobRecord
from ._schema import WRITABLE, updated
from ._states import JOB_TABLE, JobEvent, JobState


class SqlQueries(HoldingQueries):
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
    def _update(self, sql: str, args: Sequence[Any]) -> int:
        """Run one ``UPDATE`` (``?`` placeholders); return how many rows it changed."""

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
        unless_leased: bool = False,
    ) -> JobRecord:
        """Check ``event`` against the table, apply it and its audit row.

        The row changes only if it is still as ``job`` was read (its state
        and attempt) and, with ``unless_leased``, if no live lease holds it
        at ``now``: one conditional ``UPDATE``, so that a rescue judges the
        lease as it is when it writes, not as an earlier read saw it.

        Raises:
            LostJobError: if the row changed since it was read, or a live
                lease holds it; nothing is written.
        """
        target = JOB_TABLE.move(job.state, event, subject=f"job {job.id}")
        given = {"state": target.value, **changes}
        if target.terminal:
            given["ended_at"] = now
        unknown = given.keys() - set(WRITABLE)
        if unknown:  # a bug of this package: JobStore checks what callers give
            raise ValueError(f"jobs has no writable column {sorted(unknown)}")
        # The statement names the schema's columns, never the keys given.
        columns: dict[str, Any] = {n: given[n] for n in WRITABLE if n in given}
        assignments = ", ".join(f"{name} = ?" for name in columns)
        condition = "id = ? AND state = ? AND attempts = ?"
        args: tuple[Any, ...] = (job.id, job.state.value, job.attempts)
        if unless_leased:
            condition += (
                " AND NOT EXISTS (SELECT 1 FROM job_workers w "
                "WHERE w.id = jobs.worker AND w.expires_at > ?)"
            )
            args = (*args, now)
        changed = self._update(
            f"UPDATE jobs SET {assignments} WHERE {condition}",
            (*columns.values(), *args),
        )
        if changed != 1:
            raise LostJobError(
                f"job {job.id} changed before its {event.value} was written; "
                f"it is no longer {job.state.value} on attempt {job.attempts}"
                + (" of a worker without a lease" if unless_leased else "")
            )
        self._execute(
            "INSERT INTO job_events (job, source, target, at, worker, reason) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (job.id, job.state.value, target.value, now, worker, reason),
        )
        return updated(job, columns, at=now)

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
