"""A worker's writes to the jobs it holds: claiming, progress, endings.

The part of `SqlQueries` that a worker calls while it runs jobs. Every
operation is one transaction. A worker that finishes a job while it has a
free slot settles the job and claims the next ones in the same transaction
(`finish_then_claim`): one commit, and so one flush to disk, where a
settlement and a claim apart would take two.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ._leases import LeaseQueries, lost_job_error
from ._reads import ReadQueries
from ._records import JobRecord
from ._schema import COLUMNS, record
from ._states import JOB_TABLE, JobEvent, JobState


class HoldingQueries(ReadQueries, LeaseQueries):
    """Claims, progress and endings, over the statements of `SqlQueries`."""

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

        All in one transaction, which renews the worker's lease first (if
        less than half of it is left: see `_renew_for_claims`).
        """
        with self._transaction():
            now = self._now(now)
            self._renew_for_claims(worker, now, lease, incarnation)
            return self._claim(worker, now, stale_after, kinds, limit)

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
            return self._finish(
                job_id, event, worker, attempt, now, reason, changes, traceback
            )

    def finish_then_claim(
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
        lease: float,
        stale_after: float | None,
        incarnation: str | None = None,
        kinds: Sequence[str] | None = None,
        limit: int,
    ) -> tuple[JobRecord, list[JobRecord]]:
        """`finish`, then `claim_many`, committed together.

        The lease is renewed first: if another process holds the worker's
        id (`WorkerReplacedError`), nothing is written. Its take-over has
        settled the job already; the ending is not this process's to write.
        """
        with self._transaction():
            now = self._now(now)
            self._renew_for_claims(worker, now, lease, incarnation)
            job = self._finish(
                job_id, event, worker, attempt, now, reason, changes, traceback
            )
            return job, self._claim(worker, now, stale_after, kinds, limit)

    def _renew_for_claims(
        self, worker: str, now: float, lease: float, incarnation: str | None
    ) -> None:
        # The worker renews its lease every third of it: a claim extends a
        # lease only if that fell behind (after an outage, say), and
        # otherwise leaves the row, and its page on disk, untouched.
        self._renew(
            worker, now + lease, incarnation=incarnation, unless_after=now + lease / 2
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
            job = self._holds(self._get(job_id, lock=True), worker, attempt)
            # A job being cancelled runs on until it stops: its progress
            # shows. A late write never changes an ending.
            if job.state not in (JobState.RUNNING, JobState.CANCELLING):
                return
            self._execute(
                "UPDATE jobs SET progress = ?, last_heartbeat_at = ? WHERE id = ?",
                (json.dumps(dict(progress)), now, job_id),
            )

    def _claim(
        self,
        worker: str,
        now: float,
        stale_after: float | None,
        kinds: Sequence[str] | None,
        limit: int,
    ) -> list[JobRecord]:
        of_kinds = (
            "" if kinds is None else f" AND kind IN ({', '.join('?' * len(kinds))})"
        )
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

    def _finish(
        self,
        job_id: str,
        event: JobEvent,
        worker: str,
        attempt: int,
        now: float,
        reason: str,
        changes: Mapping[str, Any],
        traceback: str | None,
    ) -> JobRecord:
        job = self._holds(self._get(job_id, lock=True), worker, attempt)
        JOB_TABLE.move(job.state, event, subject=f"job {job_id}")
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
            job = attrs.evolve(job, traceback=traceback)
        return self._write(
            job, event, now=now, worker=worker, reason=reason, changes=changes
        )

    def _holds(self, job: JobRecord, worker: str, attempt: int) -> JobRecord:
        """Return ``job`` if its attempt ``attempt`` is still ``worker``'s.

        Raises:
            LostJobError: naming where the job is now (`lost_job_error`).
        """
        lost = lost_job_error(
            job, worker, attempt, set_by=functools.partial(self._set_by, job.id)
        )
        if lost is not None:
            raise lost
        return job

    def _set_by(self, job_id: str) -> str | None:
        """The worker that wrote the job's last transition (None: a client)."""
        rows = self._execute(
            "SELECT worker FROM job_events WHERE job = ? ORDER BY seq DESC LIMIT 1",
            (job_id,),
        )
        return rows[0][0] if rows else None
