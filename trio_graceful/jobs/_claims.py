"""How a worker claims: its lease and identity, how many, and what is uncertain.

Jobs are claimed by the worker's claim loop, as many as there are free
slots in one transaction, and by the settlement of a finished job, which
claims the next ones in the same transaction (`JobStore.finish_then_claim`).
Both go through `Claims`, which counts them and remembers when a claim
failed: an outage can take the answer of a committed claim with it, so
before the next claim the jobs running under the worker's id that it does
not hold are queued again (`JobStore.release_strays`). `Claims.settle`
writes each transition of a job the worker holds, with the claim when the
transition ends the job.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Generator
from typing import Any

import attrs

from .._core._log import library_logger
from ._exceptions import IllegalJobTransitionError, LostJobError
from ._records import JobRecord
from ._states import JOB_TABLE, JobEvent
from ._store import JobStore

logger = library_logger("trio_graceful.jobs")


@attrs.define(eq=False)
class Claims:
    """The claiming of the worker ``worker_id``, process ``incarnation``."""

    store: JobStore
    worker_id: str
    incarnation: str
    lease: float
    stale_after: float
    concurrency: int
    kinds: tuple[str, ...]
    """The kinds the worker has functions for: the only ones it claims."""
    claimed: int = 0
    """Jobs claimed since the worker started."""
    open: bool = True
    """False once the worker drains: no more claims."""
    uncertain: bool = False
    """True after a claim failed, until strays are released."""

    def free(self, running: int) -> int:
        """How many jobs to claim while ``running`` run. Not a checkpoint."""
        return max(0, self.concurrency - running) if self.open else 0

    def count(self, jobs: list[JobRecord]) -> list[JobRecord]:
        """Note the jobs a claim brought. Not a checkpoint."""
        self.claimed += len(jobs)
        return jobs

    @contextlib.contextmanager
    def uncertain_on_failure(self) -> Generator[None, None, None]:
        """Note that a claim made in the block may be committed if it raises.

        An outage can take the answer of a committed claim with it. Not a
        checkpoint.
        """
        try:
            yield
        except BaseException:
            self.uncertain = True
            raise

    async def claim(self, held: Collection[str], limit: int) -> list[JobRecord]:
        """Claim up to ``limit`` jobs, first releasing strays if uncertain.

        ``held``, the ids of the jobs the worker runs, is read when the
        store's turn comes: pass a live view, so that jobs claimed by a
        settlement meanwhile count. This is a checkpoint.
        """
        if self.uncertain:
            strays = await self.store.release_strays(self.worker_id, held=held)
            for job in strays:
                logger.warning(
                    "worker %s released job %s, claimed as the store went away",
                    self.worker_id,
                    job.id,
                )
            self.uncertain = False
        with self.uncertain_on_failure():
            jobs = await self.store.claim_many(
                self.worker_id,
                limit=limit,
                lease=self.lease,
                stale_after=self.stale_after,
                kinds=self.kinds,
                incarnation=self.incarnation,
            )
        return self.count(jobs)

    async def settle(
        self,
        job: JobRecord,
        event: JobEvent,
        *,
        reason: str,
        retry: bool,
        limit: int,
        changes: dict[str, Any],
    ) -> tuple[JobRecord, list[JobRecord]]:
        """Write ``event`` of ``job``; if it ends the job, claim up to ``limit`` too.

        Returns the job as written and the jobs claimed with it. ``retry``
        tells a try after one that failed with an outage, which may have
        been committed all the same (the answer was lost with the
        connection): that write is then returned, and claims go with first
        tries only. This is a checkpoint.

        Raises:
            LostJobError: if the attempt is no longer the worker's (another
                worker settled the job after this one's lease expired).
            IllegalJobTransitionError: if the table does not allow ``event``.
        """
        store = self.store
        target = JOB_TABLE.move(job.state, event, subject=f"job {job.id}")
        try:
            if not retry and target.terminal and limit:
                with self.uncertain_on_failure():
                    return await store.finish_then_claim(
                        job.id,
                        event,
                        worker=self.worker_id,
                        attempt=job.attempts,
                        reason=reason,
                        limit=limit,
                        lease=self.lease,
                        stale_after=self.stale_after,
                        kinds=self.kinds,
                        incarnation=self.incarnation,
                        **changes,
                    )
            done = await store.finish(
                job.id,
                event,
                worker=self.worker_id,
                attempt=job.attempts,
                reason=reason,
                **changes,
            )
            return done, []
        except (IllegalJobTransitionError, LostJobError):
            if not retry:
                raise
            now = await store.get(job.id)
            if (now.state, now.worker, now.attempts) != (
                target,
                self.worker_id,
                job.attempts,
            ):
                raise
            return now, []
