"""The attempts a worker runs: each in its own bundle, settled in the store.

A `Supervisor` runs the worker's attempts (`Attempt`, whose state is a
table; `RunningAttempts` keeps them by job id and frees their slots) and
owns the moment the worker began to drain. A job's function runs
as the child of a bundle whose body waits for the attempt's end to be
decided and carries it out; a hard cancel of the job ends that body too
(`open_bundle_cancelling_body`: one nursery, no host task), and the ending
is written after the block. The settlement of a job claims the next in the
same transaction, and the first job claimed runs next in the same task. An
attempt's end is decided by whichever comes first:

* its function returns or raises: ``completed`` or ``failed``;
* a cancel request (read from the store, so it may come from any process):
  ``cancelling`` is written, STOP goes to the job (`Bundle.shutdown` with
  ``cancel_grace``), and ``cancelled`` is written once it has unwound
  (``completed``, with its result, if its function returned all the same);
* its deadline, a plain Trio deadline: ``timing_out`` is written, the job is
  hard-cancelled, and ``timed_out`` written with the time and elapsed
  seconds;
* the worker's drain: STOP and what is left of the worker's ``grace``; a
  job that ends in time is settled as usual, the others are hard-cancelled
  and handed back (``queued``, progress kept, not counted against
  ``max_attempts``).

Every write goes through the worker's `StoreAccess`, so a store outage
delays it and never fails the job. Progress reported during an outage is
kept in the attempt and written when the store is back (the last wins).

An attempt whose job another worker settled after this one's lease expired
is *lost* (see `RunningAttempts`): hard-cancelled, it writes nothing more,
and the worker goes on.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from typing import Any

import attrs
import outcome
import trio

from .._children._threads import ThreadBudget
from .._core._bundle import Bundle
from .._core._groups import as_group, first_leaf
from .._core._log import library_logger
from .._core._openbundle import open_bundle_cancelling_body
from .._core._trace import TraceKind, emit, tracing
from ._access import StoreAccess
from ._attempt import Attempt, AttemptEvent, AttemptState
from ._claims import Claims
from ._context import JobContext
from ._exceptions import (
    IllegalJobTransitionError,
    JobStopped,
    LostJobError,
    StoreUnavailableError,
)
from ._functions import JobFunction
from ._jsonrule import to_json
from ._records import JobRecord
from ._running import RunningAttempts
from ._states import JobEvent, JobState
from ._traceback import report_failure

logger = library_logger("trio_graceful.jobs")

# What the supervisor's own writes raise when the job is not its to settle.
_STORE_ERRORS = (LostJobError, IllegalJobTransitionError, StoreUnavailableError)


def _trace(worker_id: str, job_id: str, source: JobState, target: JobState) -> None:
    if tracing.active:
        emit(
            TraceKind.STATE_CHANGED,
            f"jobs of {worker_id}",
            f"job {job_id}",
            detail=f"job {job_id}: {source.value} -> {target.value}",
        )


def _job_error(exc: BaseException) -> BaseException | None:
    """The job's outcome, out of what left the job's bundle; None if not the job's.

    The store's errors, raised by the writes of the bundle's body, are the
    supervisor's to handle: the first is raised again, on its own. What is
    neither an `Exception` nor `JobStopped` (`trio.Cancelled` from outside,
    `KeyboardInterrupt`) is not the job's either: None. Subtasks that all
    raised `JobStopped` stopped as asked; if others raised something else,
    that fails the job, without the `JobStopped` of the rest.
    """
    group = as_group(exc)
    if group is None:
        if isinstance(exc, _STORE_ERRORS):
            raise exc
        return exc if isinstance(exc, (Exception, JobStopped)) else None
    ours, _ = group.split(_STORE_ERRORS)
    if ours is not None:
        raise first_leaf(ours)
    _, foreign = group.split((Exception, JobStopped))
    if foreign is not None:
        return None
    _, rest = group.split(JobStopped)
    return first_leaf(group) if rest is None else rest


def _failure(error: BaseException) -> str:
    """The one line a failed job's ``error`` keeps."""
    if as_group(error) is None:
        return f"raised {error!r}"
    return f"a subtask raised {first_leaf(error)!r}"


def _json_text(value: object) -> str:
    """The JSON text of a job's progress or failed subtasks, most often none."""
    if value is None:
        return "null"
    if value == ():
        return "[]"
    return json.dumps(value)


@attrs.define(eq=False)
class Supervisor:
    """Runs and settles the attempts of the worker ``worker_id``."""

    access: StoreAccess
    worker_id: str
    functions: Mapping[str, JobFunction]
    cancel_grace: float
    heartbeat_interval: float
    budget: ThreadBudget | None
    claims: Claims
    attempts: RunningAttempts = attrs.field(init=False)
    #: Where the attempts run, while the worker serves.
    bundle: Bundle | None = None
    drain_deadline: float | None = None
    #: Jobs whose ending could not be written before the drain deadline.
    unsettled: list[str] = attrs.field(factory=list[str])

    def __attrs_post_init__(self) -> None:
        self.attempts = RunningAttempts(self.worker_id, self.claims.concurrency)

    @property
    def running(self) -> dict[str, Attempt]:
        """The attempt run of each job, by the job's id."""
        return self.attempts.running

    def add(self, jobs: list[JobRecord]) -> None:
        """Start an attempt of each job of ``jobs``, just claimed. Not a checkpoint."""
        assert self.bundle is not None
        for job in jobs:
            self.bundle.start_soon(self._supervise, self._attempt(job), name="job slot")

    def _attempt(self, job: JobRecord) -> Attempt:
        attempt = self.attempts.add(job)
        _trace(self.worker_id, job.id, JobState.QUEUED, JobState.RUNNING)
        if self.drain_deadline is not None:
            attempt.apply(AttemptEvent.DRAIN)  # claimed as the drain began
        return attempt

    def drain(self, grace: float) -> None:
        """Give every attempt STOP and ``grace`` seconds. Not a checkpoint."""
        self.drain_deadline = trio.current_time() + grace
        self.claims.open = False
        self.access.give_up_at(self.drain_deadline)
        for attempt in self.running.values():
            attempt.apply(AttemptEvent.DRAIN)

    def cancel(self, job_ids: list[str]) -> None:
        """Serve the cancel requests of ``job_ids``. Not a checkpoint."""
        for job_id in job_ids:
            attempt = self.running.get(job_id)
            if attempt is not None:
                attempt.apply(AttemptEvent.CANCEL)

    async def check_held(self) -> None:
        """Stop the attempts whose jobs are another's now. This is a checkpoint."""
        await self.attempts.check(self.access)

    async def flush_progress(self) -> None:
        """Write the progress reported during an outage. This is a checkpoint."""
        await trio.lowlevel.checkpoint()
        for attempt in list(self.running.values()):
            while (
                attempt.unsaved is not None
                and self.running.get(attempt.job.id) is attempt
            ):
                progress, attempt.unsaved = attempt.unsaved, None
                save = functools.partial(self._save, attempt, progress)
                try:
                    await self.access.call("saving progress", save)
                except LostJobError as lost:
                    self.attempts.lose(attempt, lost)

    async def _save(self, attempt: Attempt, progress: Mapping[str, Any]) -> None:
        job = attempt.job
        await self.access.store.save_progress(
            job.id, progress, worker=self.worker_id, attempt=job.attempts
        )

    async def _report(self, attempt: Attempt, progress: Mapping[str, Any]) -> None:
        """The job's `JobContext.report_progress`: never blocks on an outage."""
        attempt.unsaved = progress
        if self.access.down:
            await trio.lowlevel.checkpoint()
            return
        attempt.unsaved = None  # newer than anything waiting to be flushed
        try:
            await self._save(attempt, progress)
        except LostJobError as lost:
            # The job's own tasks are cancelled with it: the checkpoint
            # raises trio.Cancelled here, as at any point of a hard cancel.
            self.attempts.lose(attempt, lost)
            await trio.lowlevel.checkpoint()
            raise
        except Exception as exc:
            if not self.access.note("saving progress", exc):
                raise
            attempt.keep_unsaved(progress)

    async def _write(
        self, attempt: Attempt, event: JobEvent, reason: str, **changes: Any
    ) -> None:
        """Write ``event``; after an ending, claim the next jobs in the same trip."""
        job = attempt.job
        tries = 0

        async def write() -> tuple[JobRecord, list[JobRecord]]:
            nonlocal tries
            tries += 1
            limit = self.claims.free(len(self.running) - 1)
            return await self.claims.settle(
                job, event, reason=reason, retry=tries > 1, limit=limit, changes=changes
            )

        attempt.job, claimed = await self.access.call(f"settling job {job.id}", write)
        _trace(self.worker_id, job.id, job.state, attempt.job.state)
        if claimed:
            # The first job claimed goes on in this task (see _supervise).
            attempt.successor = self._attempt(claimed[0])
            self.add(claimed[1:])
            self.claims.count(claimed)

    async def _supervise(self, attempt: Attempt) -> None:
        # One job after another: the settlement of each claims the next,
        # which runs in the same task, saving a task per job.
        next_up: Attempt | None = attempt
        while next_up is not None:
            attempt = next_up
            job = attempt.job
            try:
                await self._run(attempt)
            except LostJobError as lost:
                # A rescuer took the job from us (our lease had expired): its
                # state is no longer ours to write, and nothing was written.
                self.attempts.lose(attempt, lost)
            except IllegalJobTransitionError as exc:
                logger.warning("worker %s: %s", self.worker_id, exc)
            except StoreUnavailableError:
                self.unsettled.append(job.id)
            finally:
                self.attempts.end(attempt)
            next_up = attempt.successor

    async def _run(self, attempt: Attempt) -> None:
        job = attempt.job
        # The worker claims only the kinds it has functions for.
        ctx, hard_cancelled = await self._attend(attempt, self.functions[job.kind])
        ended = attempt.outcome
        if attempt.state is AttemptState.LOST:
            return  # stopped, logged, nothing to write: see lose()
        if attempt.state is AttemptState.TIMING_OUT:
            assert job.timeout is not None
            await self._write(
                attempt,
                JobEvent.FINISH_TIME_OUT,
                "cleanup done",
                error=f"timed out after {job.timeout:g} s",
                elapsed=self._elapsed(job),
            )
        elif isinstance(ended, outcome.Value):
            # A job that returned did its work, even if a cancel request
            # came meanwhile (it never looked at its STOP): completed.
            await self._write(
                attempt,
                JobEvent.COMPLETE,
                "returned",
                result=ended.value,  # JSON text, see _call
                failed_subtasks=_json_text(ctx.failed_subtasks),
                progress=_json_text(ctx.progress),
                elapsed=self._elapsed(job),
            )
        elif attempt.state is AttemptState.CANCELLING:
            how = "after a hard cancel" if hard_cancelled else "cooperatively"
            await self._end(attempt, ctx, JobEvent.FINISH_CANCEL, f"cancelled {how}")
        elif isinstance(ended, outcome.Error) and not isinstance(
            ended.error, JobStopped
        ):
            why = _failure(ended.error)
            failure = report_failure(self.worker_id, job, why, ended.error)
            await self._end(attempt, ctx, JobEvent.FAIL, why, traceback=failure)
        elif attempt.cancel_requested:
            # Asked to cancel while draining: the request wins over a hand-back.
            await self._write(
                attempt, JobEvent.CANCEL, "cancel requested while draining"
            )
            await self._end(attempt, ctx, JobEvent.FINISH_CANCEL, "cancelled")
        else:
            await self._write(
                attempt,
                JobEvent.REQUEUE,
                f"handed back by worker {self.worker_id} at its shutdown",
                progress=_json_text(ctx.progress),
                elapsed=self._elapsed(job),
            )

    async def _attend(
        self, attempt: Attempt, fn: JobFunction
    ) -> tuple[JobContext, bool]:
        """Run the job in its bundle until it has ended, as decided.

        A cancel request's ``cancelling`` and a timeout's ``timing_out`` are
        written here, before the job is stopped. Returns the job's context
        and whether its bundle was hard-cancelled, once the bundle is
        closed; the job's ending is still to be written.
        """
        job = attempt.job
        deadline = (
            math.inf if job.timeout is None else trio.current_time() + job.timeout
        )

        async def save(progress: Mapping[str, Any]) -> None:
            await self._report(attempt, progress)

        ctx: JobContext | None = None
        bundle: Bundle | None = None
        # A hard cancel of the job ends this body with it (one nursery, no
        # host task, for every job): what is left is written after the block.
        try:
            async with open_bundle_cancelling_body(name=f"job {job.id}") as bundle:
                attempt.scope = bundle.cancel_scope
                ctx = JobContext._create(  # pyright: ignore[reportPrivateUsage]
                    job,
                    bundle,
                    save,
                    self.access.store.now,
                    self.heartbeat_interval,
                    self.budget,
                )
                bundle.start_soon(
                    self._call, fn, ctx, bundle, attempt, name=f"{job.kind} {job.id}"
                )
                state = await attempt.wait_decided(deadline)
                if state is AttemptState.TIMING_OUT:
                    assert job.timeout is not None
                    await self._write(
                        attempt,
                        JobEvent.TIME_OUT,
                        f"deadline of {job.timeout:g} s passed",
                    )
                    await bundle.cancel(0)
                elif state is AttemptState.CANCELLING:
                    await self._write(attempt, JobEvent.CANCEL, "cancel requested")
                    await bundle.shutdown(self.cancel_grace)
                elif state is AttemptState.LOST:
                    pass  # hard-cancelled by lose(): the block ends at once
                elif state is not AttemptState.ENDED:
                    assert self.drain_deadline is not None
                    grace = max(0.0, self.drain_deadline - trio.current_time())
                    await bundle.shutdown(grace)
        except BaseException as exc:
            # The function's own errors are its outcome already (see _call).
            error = _job_error(exc)
            if error is None:
                raise
            attempt.outcome = outcome.Error(error)
        finally:
            attempt.scope = None
        # both made before the first checkpoint of the block
        assert ctx is not None
        assert bundle is not None
        return ctx, bundle.cancel_scope.cancel_called

    async def _end(
        self,
        attempt: Attempt,
        ctx: JobContext,
        event: JobEvent,
        why: str,
        **more: Any,
    ) -> None:
        await self._write(
            attempt,
            event,
            why,
            **more,
            error=why,
            failed_subtasks=_json_text(ctx.failed_subtasks),
            progress=_json_text(ctx.progress),
            elapsed=self._elapsed(attempt.job),
        )

    def _elapsed(self, job: JobRecord) -> float:
        assert job.started_at is not None
        return self.access.store.now() - job.started_at

    async def _call(
        self, fn: JobFunction, ctx: JobContext, bundle: Bundle, attempt: Attempt
    ) -> None:
        with bundle.on_stop(ctx._request_stop):  # pyright: ignore[reportPrivateUsage]
            try:
                # A result that is not JSON fails the job, with its path.
                value = to_json(await fn(ctx), what="result")
            except (Exception, JobStopped) as exc:
                # JobStopped is a BaseException, as trio.Cancelled is.
                attempt.outcome = outcome.Error(exc)
            else:
                attempt.outcome = outcome.Value(value)
        attempt.apply(AttemptEvent.END)
