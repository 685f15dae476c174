"""The attempts a worker runs, by job id: their slots, and the ones it lost.

`RunningAttempts.running` maps a job's id to the attempt the worker runs
of it. One job can have two attempts in the worker at once: a *lost* one,
still unwinding, and a new one. An attempt is lost when another worker
settled its job after this worker's lease had run out (a rescue during an
outage, say), and the job may have been claimed again since, by this very
worker. So a lost attempt leaves `running` at once (its slot is free for
the claim loop), and an attempt that ends removes its entry only if the
entry is still its own.

An attempt is found lost by any of its writes (the store refuses them with
`LostJobError`), by `RunningAttempts.check` (after each renewal of the
lease, for a job that reports nothing), or by a claim that brings its job
back (`RunningAttempts.add`). It is then hard-cancelled, writes nothing
more, and is logged at WARNING with where its job is now; the worker goes
on.
"""

from __future__ import annotations

import functools

import attrs
import trio

from .._core._log import library_logger
from ._access import StoreAccess
from ._attempt import Attempt, AttemptEvent, AttemptState
from ._exceptions import LostJobError
from ._leases import lost_job_error
from ._records import JobRecord

logger = library_logger("trio_graceful.jobs")


@attrs.define(eq=False)
class RunningAttempts:
    """The attempts that the worker ``worker_id`` runs, ``concurrency`` at most."""

    worker_id: str
    concurrency: int
    running: dict[str, Attempt] = attrs.field(factory=dict[str, Attempt])
    """The attempt run of each job, by the job's id."""
    ended: dict[str, int] = attrs.field(factory=dict[str, int])
    """How many attempts ended in each state (``"lost"`` for those lost)."""
    _slot_freed: trio.Event = attrs.field(factory=trio.Event, init=False)

    def add(self, job: JobRecord) -> Attempt:
        """A new attempt of ``job``, just claimed. Not a checkpoint.

        An earlier attempt of the job still here is lost: the store gave the
        job back to the worker on a new attempt.
        """
        earlier = self.running.get(job.id)
        if earlier is not None:
            lost = lost_job_error(job, self.worker_id, earlier.job.attempts)
            assert lost is not None  # a later attempt
            self.lose(earlier, lost)
        attempt = self.running[job.id] = Attempt(job)
        return attempt

    def end(self, attempt: Attempt) -> None:
        """Count ``attempt`` as ended and free its slot. Not a checkpoint."""
        job_id = attempt.job.id
        # A lost attempt has left already, and a new attempt of the same
        # job may be running in its place.
        if self.running.get(job_id) is attempt:
            del self.running[job_id]
        # The claim loop waits for a free slot; a settlement that claimed a
        # job in this one's place left none.
        if len(self.running) < self.concurrency:
            self._slot_freed.set()
        if attempt.state is AttemptState.LOST:
            state = "lost"
        else:
            state = attempt.job.state.value
        self.ended[state] = self.ended.get(state, 0) + 1

    async def wait_slot(self) -> None:
        """Wait until fewer than ``concurrency`` attempts run. This is a checkpoint."""
        await trio.lowlevel.checkpoint()
        while len(self.running) >= self.concurrency:
            await self._slot_freed.wait()
            self._slot_freed = trio.Event()

    def lose(self, attempt: Attempt, lost: LostJobError) -> None:
        """Stop ``attempt``, no longer the worker's: hard-cancel it, log ``lost``.

        The attempt leaves `running` (its slot is free) and writes nothing
        more. Once is enough: later calls do nothing. Not a checkpoint.
        """
        if attempt.state is AttemptState.LOST:
            return
        attempt.apply(AttemptEvent.LOSE)
        job_id = attempt.job.id
        if self.running.get(job_id) is attempt:
            del self.running[job_id]
            self._slot_freed.set()
        if attempt.scope is not None:
            attempt.scope.cancel(reason=f"job {job_id} is no longer this worker's")
        logger.warning("worker %s: %s; its attempt was stopped", self.worker_id, lost)

    async def check(self, access: StoreAccess) -> None:
        """Stop the attempts whose jobs the store says are another's now.

        For a job that reports no progress, the only way to learn of a
        rescue before it ends. Reads the jobs whose functions still run
        (those that are settling write, and learn it then). This is a
        checkpoint.
        """
        attending = [a for a in self.running.values() if a.scope is not None]
        if not attending:
            await trio.lowlevel.checkpoint()
            return
        ids = [attempt.job.id for attempt in attending]
        records = await access.call(
            "checking its jobs", lambda: access.store.jobs(ids), writes=False
        )
        taken = [
            (attempt, now)
            for attempt, now in zip(attending, records, strict=True)
            if lost_job_error(now, self.worker_id, attempt.job.attempts) is not None
        ]
        if not taken:
            return

        # Who settled each one, to name it: another worker, or a client.
        async def read_setters() -> list[str | None]:
            return [(await access.store.events(job.id))[-1].worker for _, job in taken]

        setters = await access.call("checking its jobs", read_setters, writes=False)
        for (attempt, now), setter in zip(taken, setters, strict=True):
            # Only an attempt still in its bundle: one that has left it may
            # have written its own ending since the read.
            if attempt.scope is None or attempt.state is AttemptState.LOST:
                continue
            lost = lost_job_error(
                now,
                self.worker_id,
                attempt.job.attempts,
                set_by=functools.partial(_given, setter),
            )
            if lost is not None:
                self.lose(attempt, lost)


def _given(value: str | None) -> str | None:
    return value
