"""Every exception of the durable jobs, each named by the condition it reports.

* The store: `StoreError` (it cannot be opened or used), with
  `StoreGoneError` (its file was deleted or replaced) and
  `StoreUnavailableError` (it stayed away until the shutdown deadline).
* A job: `JobNotFoundError` (no such id), `IllegalJobTransitionError` (the
  transition table refuses the event), `LostJobError` (the attempt is
  another's now).
* A worker: `WorkerReplacedError` (a new process took its id).
* Inside a job function: `JobStopped` (asked to stop) and
  `CallTimeoutError` (a call ran past its limit).
* Inside a worker: `IllegalAttemptTransitionError`, a bug if ever raised.
"""

from __future__ import annotations

from .._core._statetable import IllegalTransitionError


class StoreError(Exception):
    """The store cannot be opened or used (not a database, wrong schema, ...)."""


class StoreGoneError(StoreError):
    """The store's file was deleted or replaced under a running worker.

    The worker stops: what it would write would be lost with the old file.
    """


class StoreUnavailableError(StoreError):
    """The store stayed away until the worker's shutdown deadline."""


class JobNotFoundError(LookupError):
    """A job id that the store does not hold."""


class IllegalJobTransitionError(IllegalTransitionError):
    """An event that the job transition table does not allow in the job's state.

    The job is left unchanged.
    """


class IllegalAttemptTransitionError(IllegalTransitionError):
    """An event that the table of a job attempt does not allow; nothing changed."""


class LostJobError(RuntimeError):
    """A worker wrote to a job attempt that is no longer its own.

    Another worker settled the job after this one's lease expired (queued
    it again, or failed, cancelled or timed it out), and the job may run on
    a later attempt since; the write is refused and changes nothing. The
    message names the job, the attempt and where the job is now.
    """


class WorkerReplacedError(RuntimeError):
    """Another process took over this worker's id (it was restarted).

    The old process stops at once: its jobs are the new one's to settle.
    """


class JobStopped(BaseException):
    """Raised by `JobContext.checkpoint` once the job has been asked to stop.

    Let it propagate: the worker then ends the job as cancelled (after a
    cancel request) or hands it back to the queue (at the worker's shutdown).
    Like `trio.Cancelled`, it derives from `BaseException`, not `Exception`,
    so that a job's ``except Exception:`` (around a call to a provider, say)
    lets it through instead of swallowing the stop until the hard cancel.
    Catch it by name to clean up, and raise it again.
    """


class CallTimeoutError(Exception):
    """A call run under `JobContext.call_timeout` took longer than its limit.

    Attributes:
        name (str): The call's name.
        elapsed (float): Seconds it ran.
        limit (float): Seconds it was allowed.
    """

    def __init__(self, name: str, elapsed: float, limit: float) -> None:
        super().__init__(
            f"call {name!r} timed out after {elapsed:g} s (limit {limit:g} s)"
        )
        self.name = name
        self.elapsed = elapsed
        self.limit = limit
