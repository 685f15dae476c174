"""The worker: holds its id, claims jobs, and keeps its lease and its store.

Each running job is a child of the worker's bundle with a bundle of its own
(`Supervisor` runs and settles them). Beside the jobs, keeper tasks that
outlive them renew the lease (so it stays valid while the jobs drain),
serve cancel requests, rescue the jobs of dead workers, write progress
reported during a store outage once the store is back, and check that the
store's file is still the one opened (`StoreGoneError` otherwise).

A worker's id is held by one process at a time: at its start, the worker
takes the id over (`JobStore.take_over`), settling at once the jobs an
earlier process under that id left; an earlier process still alive stops
at its next renewal (`WorkerReplacedError`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio

from .._children._threads import ThreadBudget
from .._core._inbox import InboxReceiver
from .._core._log import library_logger, plural
from .._core._openbundle import open_bundle
from .._run._program._lifecycle import Lifecycle
from .._run._program._runner import current_runner
from ._access import StoreAccess
from ._claims import Claims
from ._exceptions import StoreUnavailableError
from ._functions import JobFunction, check_functions
from ._jobchecks import (
    check_at_least_one,
    check_duration,
    check_text,
    checked_as,
    seconds,
)
from ._records import JobRecord
from ._store import JobStore
from ._supervisor import Supervisor

logger = library_logger("trio_graceful.jobs")


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
    """How many attempts ended in each state (``"queued"`` for hand-backs,
    ``"lost"`` for attempts stopped because another worker took their job)."""
    draining: bool
    """True once the worker has stopped claiming."""


@attrs.define(eq=False)
class Worker:
    """Runs the jobs of a `JobStore` with the functions of ``functions``.

    Run it as a service of `trio_graceful.run`
    (``await runner.start_service(worker.serve)``), or call `serve` with an
    inbox of your own: STOP in that inbox begins the graceful shutdown.

    Store outages (a lost connection, a lock held past the busy timeout, a
    disk refusing writes) are retried, never recorded as a job's failure;
    under `trio_graceful.run` the program is ``degraded`` meanwhile. See
    "When the store goes away" in the how-to.

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
    worker_id: str = attrs.field(
        factory=default_worker_id, kw_only=True, validator=checked_as(check_text)
    )
    concurrency: int = attrs.field(
        default=4, kw_only=True, validator=checked_as(check_at_least_one)
    )
    grace: float = attrs.field(default=10.0, kw_only=True, validator=seconds)
    cancel_grace: float = attrs.field(default=5.0, kw_only=True, validator=seconds)
    lease: float = attrs.field(
        # Seconds first, for the message a number of seconds gets everywhere.
        default=30.0,
        kw_only=True,
        validator=[seconds, checked_as(check_duration)],
    )
    stale_after: float = attrs.field(default=60.0, kw_only=True, validator=seconds)
    poll_interval: float = attrs.field(default=1.0, kw_only=True, validator=seconds)
    heartbeat_interval: float = attrs.field(
        default=1.0, kw_only=True, validator=seconds
    )
    budget: ThreadBudget | None = attrs.field(default=None, kw_only=True)
    incarnation: str = attrs.field(factory=lambda: uuid.uuid4().hex, init=False)
    """This process's life under ``worker_id`` (random); see `JobStore.take_over`."""
    _submitted: trio.Event = attrs.field(factory=trio.Event, init=False)
    """Set (and replaced) when another process may have queued a job."""
    _cancelled: trio.Event = attrs.field(factory=trio.Event, init=False)
    """Set (and replaced) when another process may have asked for a cancel."""
    _access: StoreAccess = attrs.field(init=False)
    _jobs: Supervisor = attrs.field(init=False)
    _claims: Claims = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.functions = check_functions(self.functions)
        self._access = StoreAccess(self.store, f"worker {self.worker_id}")
        self._claims = Claims(
            self.store,
            self.worker_id,
            self.incarnation,
            self.lease,
            self.stale_after,
            self.concurrency,
            tuple(sorted(self.functions)),
        )
        self._jobs = Supervisor(
            self._access,
            self.worker_id,
            self.functions,
            self.cancel_grace,
            self.heartbeat_interval,
            self.budget,
            self._claims,
        )

    def statistics(self) -> WorkerStatistics:
        """A `WorkerStatistics` snapshot. Not a checkpoint."""
        return WorkerStatistics(
            running=len(self._jobs.running),
            claimed=self._claims.claimed,
            ended=dict(self._jobs.attempts.ended),
            draining=self._jobs.drain_deadline is not None,
        )

    async def serve(
        self,
        inbox: InboxReceiver[Any],
        *,
        task_status: trio.TaskStatus[Worker] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run jobs until STOP arrives in ``inbox``, then shut down gracefully.

        First takes over its id (settling what an earlier process under it
        left) and settles what dead workers left (`JobStore.rescue`). Ready
        once the worker holds its lease. At STOP it stops claiming at once,
        gives the running jobs STOP and ``grace``, hands back what is left,
        and drops its lease. This is a checkpoint.

        Raises:
            WorkerReplacedError: if a new process took over ``worker_id``.
            StoreGoneError: if the SQLite file was deleted or replaced.
        """
        self._access.lifecycle = _current_lifecycle()
        await self._access.call(
            "connecting",
            lambda: self.store.reserve_connections(concurrency=self.concurrency),
        )
        taken = await self._access.call(
            "taking over its id",
            lambda: self.store.take_over(
                self.worker_id, incarnation=self.incarnation, lease=self.lease
            ),
        )
        self._log_settled(taken, "took over")
        await self._rescue()
        async with trio.open_nursery() as keepers:
            for keeper in (
                self._renew_lease,
                self._serve_cancel_requests,
                self._rescue_periodically,
                self._flush_progress,
                self._watch_store,
                *([self._listen] if self.store.listens else []),
            ):
                keepers.start_soon(self._keep, keeper, name=keeper.__name__)
            async with open_bundle(name=f"jobs of {self.worker_id}") as jobs:
                self._jobs.bundle = jobs
                task_status.started(self)
                await inbox.until_stop(self._claim_forever)
                logger.info(
                    "worker %s: draining %s",
                    self.worker_id,
                    plural(len(self._jobs.running), "job"),
                )
                self._jobs.drain(self.grace)
            keepers.cancel_scope.cancel(reason="the worker's jobs have ended")
        await self._leave()

    async def _keep(self, keeper: Callable[[], Awaitable[None]]) -> None:
        # Once the drain's grace is over, what a keeper would write is left
        # for the rescue: it ends, and the worker with it.
        with contextlib.suppress(StoreUnavailableError):
            await keeper()

    async def _leave(self) -> None:
        """Drop the lease, or say which jobs the lease rescue will settle."""
        unsettled = self._jobs.unsettled
        if not unsettled:
            try:
                await self._access.call(
                    "dropping its lease",
                    lambda: self.store.drop_lease(self.worker_id),
                )
                return
            except StoreUnavailableError:
                pass
        logger.warning(
            "worker %s: the store stayed away until the end of its grace; "
            "jobs left for the lease rescue: %s",
            self.worker_id,
            ", ".join(unsettled) or "none",
        )

    async def _claim_forever(self) -> None:
        running = self._jobs.running
        while True:
            await self._jobs.attempts.wait_slot()
            # Taken before the claim: news heard while it is in flight
            # (which may not have seen the new job) sets this event too.
            news = self._submitted
            limit = self._claims.free(len(running))
            claim = functools.partial(self._claims.claim, running.keys(), limit)
            jobs = await self._access.call("claiming", claim)
            if not jobs:
                await self._pause(news)
            self._jobs.add(jobs)

    async def _renew_lease(self) -> None:
        while True:
            await trio.sleep(self.lease / 3)
            await self._renew()

    async def _renew(self) -> None:
        await self._access.call(
            "renewing its lease",
            lambda: self.store.renew_lease(
                self.worker_id, lease=self.lease, incarnation=self.incarnation
            ),
        )
        # A rescuer may have settled our jobs while the lease was expired.
        await self._jobs.check_held()

    async def _serve_cancel_requests(self) -> None:
        while True:
            news = self._cancelled  # before the read, as for claims
            if self._jobs.running:
                self._jobs.cancel(
                    await self._access.call(
                        "reading cancel requests",
                        lambda: self.store.cancel_requests(self.worker_id),
                        writes=False,
                    )
                )
            await self._pause(news)

    async def _listen(self) -> None:
        while True:
            try:
                heard = await self.store.wait_for_news(self.poll_interval)
            except Exception as exc:
                # Listening only saves polls: during an outage, poll.
                if not self.store.is_outage(exc):
                    raise
                await trio.sleep(self.poll_interval)
                # What was missed meanwhile is unknown: wake both loops.
                heard = ["submitted", "cancel"]
            # Each news wakes only the loop it concerns: a busy submitter
            # costs no reads of cancel requests.
            if any(news.startswith("cancel") for news in heard):
                self._cancelled.set()
                self._cancelled = trio.Event()
            if any(not news.startswith("cancel") for news in heard):
                self._submitted.set()
                self._submitted = trio.Event()

    async def _pause(self, news: trio.Event) -> None:
        """Until the next poll, or ``news`` from another process (if it listens)."""
        with trio.move_on_after(self.poll_interval):
            await news.wait()

    async def _flush_progress(self) -> None:
        while True:
            await self._access.wait_recovered()
            await self._jobs.flush_progress()

    async def _watch_store(self) -> None:
        while True:
            await trio.sleep(self.heartbeat_interval)
            self.store.check()

    async def _rescue_periodically(self) -> None:
        while True:
            await trio.sleep(self.lease)
            await self._rescue()

    async def _rescue(self) -> None:
        async def renew_and_rescue() -> list[JobRecord]:
            # After an outage longer than the lease, ours has expired too:
            # renew it first, or we would rescue our own jobs.
            await self.store.renew_lease(
                self.worker_id, lease=self.lease, incarnation=self.incarnation
            )
            return await self.store.rescue(rescuer=self.worker_id)

        self._log_settled(
            await self._access.call("rescuing", renew_and_rescue), "rescued"
        )

    def _log_settled(self, jobs: list[JobRecord], how: str) -> None:
        for job in jobs:
            logger.warning(
                "worker %s %s job %s (attempt %d of worker %r): now %s",
                self.worker_id,
                how,
                job.id,
                job.attempts,
                job.worker,
                job.state.value,
            )


def _current_lifecycle() -> Lifecycle | None:
    try:
        return current_runner().lifecycle
    except RuntimeError:
        return None
