"""The values of a job store: a job's ending (taken), its record, an audit event."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from ._checks import check_changes, check_count, check_job_id, check_text, checked_as
from ._states import JobEvent, JobState


@attrs.frozen(kw_only=True)
class JobEnding:
    """A transition that the worker holding a job attempt writes, and what it sets.

    Each argument is checked as the job store checks its arguments
    (`JobStore.finish`); the messages name them.
    """

    job_id: str = attrs.field(validator=checked_as(check_job_id))
    """The job's id."""
    event: JobEvent
    """Which transition (`JobEvent`); the table is checked when it is written."""
    worker: str = attrs.field(validator=checked_as(check_text))
    """The worker that holds the attempt."""
    attempt: int = attrs.field(validator=checked_as(check_count))
    """The attempt the worker holds: a later one refuses the write."""
    reason: str = attrs.field(validator=checked_as(check_text, empty=True))
    """Why, in words, for the audit log."""
    changes: Mapping[str, Any] = attrs.field(
        factory=dict[str, Any], converter=check_changes
    )
    """The job's ``result``, ``progress``, ``failed_subtasks`` (JSON text),
    ``elapsed`` and ``error`` that the transition sets."""
    traceback: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(checked_as(check_text))
    )
    """The traceback of the exception that failed the job, to store with it."""


@attrs.frozen
class JobRecord:
    """A snapshot of one job as the store holds it.

    Times are Unix seconds (or the store's clock), `None` when not reached.
    """

    id: str
    """The job's id, unique in its store."""
    kind: str
    """The job function to run, by its key in the worker's registry."""
    payload: Mapping[str, Any]
    """The job's arguments, as submitted (JSON values)."""
    state: JobState
    """The current state."""
    attempts: int
    """How many times a worker has claimed the job."""
    handbacks: int
    """How many of those attempts a worker handed back at its shutdown;
    they do not count against `max_attempts`."""
    max_attempts: int
    """Attempts that may end with a dead worker before the job fails."""
    timeout: float | None
    """Seconds one attempt may run, or `None` for no limit."""
    worker: str | None
    """The worker that holds (or last held) the job."""
    created_at: float
    """When the job was submitted."""
    started_at: float | None
    """When the current (or last) attempt was claimed."""
    ended_at: float | None
    """When the job reached a terminal state."""
    last_heartbeat_at: float | None
    """When progress was last saved."""
    progress: Mapping[str, Any] | None
    """The last saved progress; a resumed attempt starts from it."""
    cancel_requested_at: float | None
    """When cancellation was requested, if it was."""
    timed_out_at: float | None
    """When the job's deadline passed, if it did."""
    elapsed: float | None
    """Seconds the last attempt ran, once it has ended."""
    error: str | None
    """Why the job failed, was cancelled or timed out."""
    result: Any
    """What the job function returned (JSON), once completed."""
    failed_subtasks: tuple[str, ...]
    """The calls the job reported as failed but went on without."""
    stale_after: float | None
    """Seconds without saved progress after which the running job counts as
    stale, as its worker was configured; `None` for never."""
    queued_at: float | None
    """While the job is queued, when it became so (submitted, handed back or
    rescued); `None` in every other state."""
    traceback: str | None
    """The traceback of the exception that failed the job, or `None`; of a
    longer one, the first 2,000 and the last 14,000 characters."""

    def waited(self, now: float) -> float | None:
        """Seconds the job has been queued, or `None` if it is not queued.

        A job of a kind that no running worker has a function for stays
        queued; this says for how long.
        """
        return None if self.queued_at is None else now - self.queued_at

    def is_stale(self, now: float) -> bool:
        """True if the job runs but has not saved progress for `stale_after` s.

        Informational only: a stale job keeps running.
        """
        stale_after = self.stale_after
        if self.state is not JobState.RUNNING or stale_after is None:
            return False
        last = self.last_heartbeat_at
        if last is None:
            last = self.started_at if self.started_at is not None else math.inf
        return now - last >= stale_after

    def as_json(self, *, now: float) -> dict[str, Any]:
        """The record as the status query's JSON object."""
        return {
            "id": self.id,
            "kind": self.kind,
            "state": self.state.value,
            "attempts": self.attempts,
            "worker": self.worker,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "last_heartbeat_at": self.last_heartbeat_at,
            "progress": self.progress,
            "stale": self.is_stale(now),
            "queued_at": self.queued_at,
            "waited": self.waited(now),
            "timed_out_at": self.timed_out_at,
            "elapsed": self.elapsed,
            "cancel_requested_at": self.cancel_requested_at,
            "error": self.error,
            "traceback": self.traceback,
            "result": self.result,
            "failed_subtasks": list(self.failed_subtasks),
        }


@attrs.frozen
class AuditEvent:
    """One row of the audit log, written with the transition it records."""

    seq: int
    """Position in the log (increasing)."""
    job: str
    """The job's id."""
    source: JobState | None
    """The state left; `None` for the submission."""
    target: JobState
    """The state entered."""
    at: float
    """When."""
    worker: str | None
    """The id of the worker that wrote it, or `None` for a client."""
    reason: str
    """Why, in words."""
