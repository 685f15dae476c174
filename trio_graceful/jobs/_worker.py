"""The job runner: claims jobs, runs each in its own bundle, settles it in the store.

Each running job is a child of the worker's bundle with a bundle of its own.
The job's end is decided by whichever comes first:

* its function returns or raises: ``completed`` or ``failed``;
* a cancel request (read from the store, so it may come from any process):
  ``cancelling`` is written, STOP goes to the job (`Bundle.shutdown` with
  ``cancel_grace``), and ``cancelled`` is written once it has unwound;
* its deadline, a plain Trio deadline: ``timing_out`` is written, the job is
  hard-cancelled, and ``timed_out`` written with the time and elapsed
  seconds;
* the worker's shutdown: STOP and the worker's ``grace``; a job that ends
  in time is settled as usual, the others are hard-cancelled and handed
  back (``queued``, progress kept, not counted against ``max_attempts``).

The worker's lease is renewed by a task that outlives the jobs, so it keeps
being renewed while they drain; cancel requests keep being served then too.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import uuid
from collections.abc import Mapping
from typing import Any, cast

import attrs
import trio

from .._children._threads import ThreadBudget
from .._core._bundle import Bundle
from .._core._inbox import InboxReceiver
from .._core._openbundle import open_bundle
from .._core._trace import TraceKind, emit, tracing
from .._core._util import check_seconds
from ._checks import check_text
from ._context import JobContext, JobStopped
from ._functions import JobFunction, check_functions
from ._jsonrule import to_json
from ._records import JobRecord
from ._sql import LostJobError
from ._states import IllegalJobTransitionError, JobEvent, JobState
from ._store import JobStore
from ._traceback import report_failure

logger = logging.getLogger("trio_graceful.jobs")


def default_worker_id() -> str:
    """``host-pid-random``: unique per worker process."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@attrs.frozen
class WorkerStatistics:
    """A snapshot of a `Worker`'s activity."""

    running: int
    """Jobs running now."""
    claimed: int
    """Jobs claimed since the worker started."""
    ended: Mapping[str, int]
    """How many attempts ended in each state (``"queued"`` for hand-backs)."""
    draining: bool
    """True once the worker has stopped claiming."""


@attrs.define(eq=False)
class _Running:
    """A job attempt in this worker: what its supervisor waits for."""

    job: JobRecord
    changed: trio.Event = attrs.field(factory=trio.Event)
    done: bool = False
    result: str = "null"  # what the function returned, as JSON text
    error: BaseException | None = None
    cancel_requested: bool = False
    draining: bool = False

    def poke(self) -> None:
        self.changed.set()


@attrs.define(eq=False)
class Worker:
    """Runs the jobs of a `JobStore` with the functions of ``functions``.

    Run it as a service of `trio_graceful.run`
    (``await runner.start_service(worker.serve)``), or call `serve` with an
    inbox of your own: STOP in that inbox begins the graceful shutdown.

    The worker claims only jobs of the kinds in ``functions``; a job of
    another kind stays queued for a worker that knows it.

    Args:
        store (JobStore): Where the jobs are.
        functions: Job kind -> ``async def fn(ctx: JobContext)``; what the
            function returns (JSON) is the job's result. See `JobFunction`
            for what counts as async.
        worker_id (str): This worker's id, unique among the workers of the
            store.
        concurrency (int): Jobs run at once.
        grace (float): Seconds the running jobs get at the worker's shutdown.
        cancel_grace (float): Seconds a job gets after a cancel request
            before it is hard-cancelled.
        lease (float): Seconds a lease lasts; renewed every third of it.
        stale_after (float): Seconds without saved progress after which a
            running job is reported stale (`JobRecord.is_stale`); it keeps
            running.
        poll_interval (float): Seconds between looks for new jobs and cancel
            requests of other processes when idle.
        heartbeat_interval (float): Least seconds between two saves of a
            job's progress (`JobContext.report_progress`).
        budget (ThreadBudget or None): For `JobContext.run_in_thread`.

    Raises:
        TypeError, ValueError: for a bad option or ``functions`` (as
            `JobFunction` says); the message names the kind.
    """

    store: JobStore
    functions: Mapping[str, JobFunction]
    worker_id: str = attrs.field(factory=default_worker_id, kw_only=True)
    concurrency: int = attrs.field(default=4, kw_only=True)
    grace: float = attrs.field(default=10.0, kw_only=True)
    cancel_grace: float = attrs.field(default=5.0, kw_only=True)
    lease: float = attrs.field(default=30.0, kw_only=True)
    stale_after: float = attrs.field(default=60.0, kw_only=True)
    poll_interval: float = attrs.field(default=1.0, kw_only=True)
    heartbeat_interval: float = attrs.field(default=1.0, kw_only=True)
    budget: ThreadBudget | None = attrs.field(default=None, kw_only=True)
    _running: dict[str, _Running] = attrs.field(factory=dict[str, _Running], init=False)
    _claimed: int = attrs.field(default=0, init=False)
    _ended: dict[str, int] = attrs.field(factory=dict[str, int], init=False)
    _drain_deadline: float | None = attrs.field(default=None, init=False)
    _slot_freed: trio.Event = attrs.field(factory=trio.Event, init=False)
    _news: trio.Event = attrs.field(factory=trio.Event, init=False)

    def __attrs_post_init__(self) -> None:
        self.functions = check_functions(self.functions)
        check_text(self.worker_id, argument="worker_id")
        if isinstance(self.concurrency, bool) or not isinstance(
            cast("object", self.concurrency), int
        ):
            raise TypeError(f"concurrency must be an int, not {self.concurrency!r}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, not {self.concurrency!r}")
        for name in (
            "grace",
            "cancel_grace",
            "stale_after",
            "poll_interval",
            "heartbeat_interval",
        ):
            check_seconds(name, getattr(self, name))
        check_seconds("lease", self.lease)
        if not (self.lease > 0 and math.isfinite(self.lease)):
            raise ValueError(f"lease must be a finite number > 0, not {self.lease!r}")

    def statistics(self) -> WorkerStatistics:
        """A `WorkerStatistics` snapshot. Not a checkpoint."""
        return WorkerStatistics(
            running=len(self._running),
            claimed=self._claimed,
            ended=dict(self._ended),
            draining=self._drain_deadline is not None,
        )

    async def serve(
        self,
        inbox: InboxReceiver[Any],
        *,
        task_status: trio.TaskStatus[Worker] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run jobs until STOP arrives in ``inbox``, then shut down gracefully.

        First settles what dead workers left (`JobStore.rescue`). Ready once
        the worker holds its lease. At STOP it stops claiming at once, gives
        the running jobs STOP and ``grace``, hands back what is left, and
        drops its lease. This is a checkpoint.
        """
        await self.store.renew_lease(self.worker_id, lease=self.lease)
        await self._rescue()
        async with trio.open_nursery() as keepers:
            keepers.start_soon(self._renew_lease)
            keepers.start_soon(self._serve_cancel_requests)
            keepers.start_soon(self._rescue_periodically)
            if self.store.listens:
                keepers.start_soon(self._listen)
            async with open_bundle(name=f"jobs of {self.worker_id}") as jobs:
                task_status.started(self)
                await inbox.until_stop(self._claim_forever, jobs)
                self._drain_deadline = trio.current_time() + self.grace
                logger.info(
                    "worker %s: draining %d jobs", self.worker_id, len(self._running)
                )
                for running in self._running.values():
                    running.draining = True
                    running.poke()
            keepers.cancel_scope.cancel(reason="the worker's jobs have ended")
        await self.store.drop_lease(self.worker_id)

    async def _claim_forever(self, jobs: Bundle) -> None:
        while True:
            while len(self._running) >= self.concurrency:
                await self._slot_freed.wait()
                self._slot_freed = trio.Event()
            job = await self.store.claim(
                self.worker_id,
                lease=self.lease,
                stale_after=self.stale_after,
                kinds=self.functions.keys(),
            )
            if job is None:
                await self._pause()
                continue
            self._claimed += 1
            self._running[job.id] = _Running(job)
            self._trace(job.id, JobState.QUEUED, JobState.RUNNING)
            jobs.start_soon(
                self._supervise, self._running[job.id], name=f"job {job.id}"
            )

    async def _renew_lease(self) -> None:
        while True:
            await trio.sleep(self.lease / 3)
            await self.store.renew_lease(self.worker_id, lease=self.lease)

    async def _serve_cancel_requests(self) -> None:
        while True:
            if self._running:
                for job_id in await self.store.cancel_requests(self.worker_id):
                    running = self._running.get(job_id)
                    if running is not None and not running.cancel_requested:
                        running.cancel_requested = True
                        running.poke()
            await self._pause()

    async def _listen(self) -> None:
        while True:
            await self.store.wait_for_news(self.poll_interval)
            self._news.set()
            self._news = trio.Event()

    async def _pause(self) -> None:
        """Until the next poll, or news from another process (if the store listens)."""
        with trio.move_on_after(self.poll_interval):
            await self._news.wait()

    async def _rescue_periodically(self) -> None:
        while True:
            await trio.sleep(self.lease)
            await self._rescue()

    async def _rescue(self) -> None:
        for job in await self.store.rescue(rescuer=self.worker_id):
            logger.warning(
                "worker %s rescued job %s: now %s",
                self.worker_id,
                job.id,
                job.state.value,
            )

    def _trace(self, job_id: str, source: JobState, target: JobState) -> None:
        if tracing.active:
            emit(
                TraceKind.STATE_CHANGED,
                f"jobs of {self.worker_id}",
                f"job {job_id}",
                detail=f"job {job_id}: {source.value} -> {target.value}",
            )

    async def _write(
        self, running: _Running, event: JobEvent, reason: str, **changes: Any
    ) -> None:
        job = running.job
        source = job.state
        running.job = await self.store.finish(
            job.id,
            event,
            worker=self.worker_id,
            attempt=job.attempts,
            reason=reason,
            **changes,
        )
        self._trace(job.id, source, running.job.state)

    async def _supervise(self, running: _Running) -> None:
        job = running.job
        try:
            await self._run_attempt(running)
        except (LostJobError, IllegalJobTransitionError) as exc:
            # A rescuer took the job from us (our lease had expired): its
            # state is no longer ours to write, and nothing was written.
            logger.warning("worker %s: %s", self.worker_id, exc)
        finally:
            del self._running[job.id]
            self._slot_freed.set()
            state = running.job.state.value
            self._ended[state] = self._ended.get(state, 0) + 1

    async def _run_attempt(self, running: _Running) -> None:
        job = running.job
        ctx = await self._attend(running, self.functions[job.kind])
        if ctx is None:
            return
        if running.done and running.error is None:
            await self._write(
                running,
                JobEvent.COMPLETE,
                "returned",
                result=running.result,
                failed_subtasks=json.dumps(ctx.failed_subtasks),
                progress=json.dumps(ctx.progress),
                elapsed=self._elapsed(job),
            )
        elif running.done and not isinstance(running.error, JobStopped):
            assert running.error is not None
            why = f"raised {running.error!r}"
            failure = report_failure(self.worker_id, job, why, running.error)
            await self._end(running, ctx, JobEvent.FAIL, why, traceback=failure)
        elif running.cancel_requested:
            # Asked to cancel while draining: the request wins over a hand-back.
            await self._write(
                running, JobEvent.CANCEL, "cancel requested while draining"
            )
            await self._end(running, ctx, JobEvent.FINISH_CANCEL, "cancelled")
        else:
            await self._write(
                running,
                JobEvent.REQUEUE,
                f"handed back by worker {self.worker_id} at its shutdown",
                progress=json.dumps(ctx.progress),
                elapsed=self._elapsed(job),
            )

    async def _attend(self, running: _Running, fn: JobFunction) -> JobContext | None:
        """Run the job in its bundle until it ends, is cancelled, times out or drains.

        Returns the context once the job's bundle is closed and its ending
        is still to be written; None if it was written here.
        """
        job = running.job
        deadline = (
            math.inf if job.timeout is None else trio.current_time() + job.timeout
        )

        async def save(progress: Mapping[str, Any]) -> None:
            await self.store.save_progress(
                job.id, progress, worker=self.worker_id, attempt=job.attempts
            )

        ctx: JobContext | None = None
        async with open_bundle(name=f"job {job.id}") as bundle:
            ctx = JobContext._create(  # pyright: ignore[reportPrivateUsage]
                job, bundle, save, self.store.now, self.heartbeat_interval, self.budget
            )
            bundle.start_soon(
                self._call, fn, ctx, bundle, running, name=f"{job.kind} {job.id}"
            )
            with trio.move_on_at(deadline) as timer:
                while not (
                    running.done or running.cancel_requested or running.draining
                ):
                    await running.changed.wait()
                    running.changed = trio.Event()
            if running.done:
                return ctx
            if timer.cancelled_caught:
                await self._time_out(running, bundle)
                return None
            if running.cancel_requested:
                await self._write(running, JobEvent.CANCEL, "cancel requested")
                report = await bundle.shutdown(self.cancel_grace)
                how = (
                    "cooperatively"
                    if report.hard_cancelled_at is None
                    else "after a hard cancel"
                )
                await self._end(
                    running, ctx, JobEvent.FINISH_CANCEL, f"cancelled {how}"
                )
                return None
            assert self._drain_deadline is not None
            await bundle.shutdown(max(0.0, self._drain_deadline - trio.current_time()))
        assert ctx is not None  # a bundle swallows no exception
        return ctx

    async def _end(
        self, running: _Running, ctx: JobContext, event: JobEvent, why: str, **more: Any
    ) -> None:
        await self._write(
            running,
            event,
            why,
            **more,
            error=why,
            failed_subtasks=json.dumps(ctx.failed_subtasks),
            progress=json.dumps(ctx.progress),
            elapsed=self._elapsed(running.job),
        )

    async def _time_out(self, running: _Running, bundle: Bundle) -> None:
        job = running.job
        assert job.timeout is not None
        await self._write(
            running,
            JobEvent.TIME_OUT,
            f"deadline of {job.timeout:g} s passed",
        )
        await bundle.cancel(0)
        await self._write(
            running,
            JobEvent.FINISH_TIME_OUT,
            "cleanup done",
            error=f"timed out after {job.timeout:g} s",
            elapsed=self._elapsed(job),
        )

    def _elapsed(self, job: JobRecord) -> float:
        assert job.started_at is not None
        return self.store.now() - job.started_at

    async def _call(
        self, fn: JobFunction, ctx: JobContext, bundle: Bundle, running: _Running
    ) -> None:
        with bundle.on_stop(ctx._request_stop):  # pyright: ignore[reportPrivateUsage]
            try:
                # A result that is not JSON fails the job, with its path.
                running.result = to_json(await fn(ctx), what="result")
            except Exception as exc:
                running.error = exc
        running.done = True
        running.poke()
