"""Who holds which jobs: workers' leases, take-overs, rescues and strays.

A worker's id names a role (``--worker-id``, often kept by a supervisor
across restarts); its *incarnation*, a random value per process, names one
process's life in that role. Each renewal of an id's lease records the
incarnation that renews it (in ``job_incarnations``, beside the lease row,
so that stores of earlier releases keep their tables as they are). A new
process under the same id takes the id over (`take_over`): from then on
the old process's renewals are refused (`WorkerReplacedError`, and it
stops), and the jobs the id held are the old process's, so they are
settled at once by the rescue instead of waiting for a lease that the new
process renews to expire.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from ._exceptions import LostJobError, WorkerReplacedError
from ._records import JobRecord
from ._sql import Database, Reply
from ._states import JobEvent, JobState


def lost_job_error(
    job: JobRecord,
    worker: str,
    attempt: int,
    *,
    set_by: Callable[[], str | None] | None = None,
) -> LostJobError | None:
    """Why the attempt ``attempt`` of ``job`` (as read now) is not ``worker``'s.

    None while it is. It is not once the job runs on a later attempt or
    under another worker, or once it is queued again or has ended, unless
    ``set_by`` (who wrote the job's last transition, asked only then) says
    that ``worker`` itself did. Without ``set_by``, for an attempt whose
    function still runs, only another can have done it.
    """
    lost = f"job {job.id} attempt {attempt} no longer belongs to worker {worker!r}"
    if job.worker != worker or job.attempts != attempt:
        return LostJobError(
            f"{lost}; it is {job.state.value} on attempt {job.attempts} "
            f"of worker {job.worker!r}"
        )
    if job.state is JobState.QUEUED or job.state.terminal:
        if set_by is None:
            return LostJobError(f"{lost}; it is {job.state.value}")
        by = set_by()
        if by != worker:
            who = "a client" if by is None else f"worker {by!r}"
            return LostJobError(f"{lost}; it is {job.state.value}, set by {who}")
    return None


_HELD = (JobState.RUNNING.value, JobState.CANCELLING.value, JobState.TIMING_OUT.value)


def read_holder(db: Database, worker: str) -> Reply:
    """Send the read (and lock) of the incarnation that holds ``worker``'s id.

    For `renew`, which reads the answer: sent first, it travels with the
    other reads of the transaction.
    """
    return db.send(
        "SELECT incarnation, (SELECT expires_at FROM job_workers w "
        "WHERE w.id = job_incarnations.id) "
        f"FROM job_incarnations WHERE id = ?{db.dialect.lock_row}",
        (worker,),
    )


def renew(
    db: Database,
    worker: str,
    expires_at: float,
    *,
    incarnation: str | None,
    take_over: bool = False,
    unless_after: float | None = None,
    holder: Reply | None = None,
) -> str | None:
    """Extend the lease; return the incarnation that held it before.

    ``incarnation=None`` renews whoever holds the row (tests and tools).
    A lease that ends after ``unless_after`` is left as it is: nothing is
    written for it (the incarnation is checked all the same). ``holder``
    is the answer of `read_holder`, if it was sent already.
    """
    rows = (holder or read_holder(db, worker)).rows()
    before: str | None = rows[0][0] if rows else None
    expires: float | None = rows[0][1] if rows else None
    if incarnation is None:
        incarnation = before or ""
    elif before not in (None, incarnation) and not take_over:
        raise WorkerReplacedError(
            f"worker id {worker!r} was taken over by another process "
            f"(incarnation {before}); this one ({incarnation}) stops"
        )
    # The lease row is written only by this id's holder, whose row is
    # locked: as read, it is left alone if it lasts long enough already.
    # The answers are not needed: they go with the next statement.
    keep_until = expires_at if unless_after is None else unless_after
    if expires is None or expires <= keep_until:
        db.send(
            "INSERT INTO job_workers (id, expires_at) VALUES (?, ?) "
            "ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at "
            "WHERE job_workers.expires_at <= ?",
            (worker, expires_at, keep_until),
        )
    if incarnation != before:
        db.send(
            "INSERT INTO job_incarnations (id, incarnation) VALUES (?, ?) "
            "ON CONFLICT (id) DO UPDATE SET incarnation = excluded.incarnation",
            (worker, incarnation),
        )
    return before


def renew_lease(
    db: Database,
    worker: str,
    *,
    now: float,
    lease: float,
    incarnation: str | None = None,
) -> None:
    """Extend ``worker``'s lease to ``lease`` seconds from now."""
    with db.transaction():
        renew(db, worker, db.now(now) + lease, incarnation=incarnation)


def take_over(
    db: Database, worker: str, *, now: float, lease: float, incarnation: str
) -> list[JobRecord]:
    """Hold ``worker``'s lease as ``incarnation``; settle what the id held.

    Returns the jobs settled: those of an earlier process under the id.
    """
    with db.transaction():
        now = db.now(now)
        renew(db, worker, now + lease, incarnation=incarnation, take_over=True)
        jobs = db.select("state IN (?, ?, ?) AND worker = ?", (*_HELD, worker))
        why = f"worker {worker!r} was restarted (a new process took its id)"
        return [_settle(db, job, now=now, rescuer=worker, why=why) for job in jobs]


def drop_lease(db: Database, worker: str) -> None:
    """Remove ``worker``'s lease and incarnation: it holds no jobs any more."""
    with db.transaction():
        db.execute("DELETE FROM job_workers WHERE id = ?", (worker,))
        db.execute("DELETE FROM job_incarnations WHERE id = ?", (worker,))


def leases(db: Database) -> dict[str, float]:
    """When each lease expires, by worker id."""
    rows = db.execute("SELECT id, expires_at FROM job_workers ORDER BY id")
    return {row[0]: row[1] for row in rows}


def rescue(db: Database, *, now: float, rescuer: str) -> list[JobRecord]:
    """Settle the jobs of workers whose lease has expired; return them.

    Each job is settled by a write on condition that no live lease holds
    it then: a job that its worker renewed and claimed again meanwhile
    is left alone, and of two rescuers racing, one settles each job.
    """
    with db.transaction():
        now = db.now(now)
        jobs = db.select(
            "state IN (?, ?, ?) AND NOT EXISTS (SELECT 1 FROM job_workers w "
            "WHERE w.id = jobs.worker AND w.expires_at > ?)",
            (*_HELD, now),
        )
        settled: list[JobRecord] = []
        for job in jobs:
            why = f"worker {job.worker!r} is gone (its lease expired)"
            try:
                settled.append(
                    _settle(
                        db, job, now=now, rescuer=rescuer, why=why, unless_leased=True
                    )
                )
            except LostJobError:
                continue  # leased again, or settled by another rescuer
        return settled


def release_strays(
    db: Database, worker: str, *, now: float, held: Collection[str]
) -> list[JobRecord]:
    """Queue again the running jobs of ``worker`` that it does not hold.

    A claim whose commit was lost with the connection leaves a job
    running under a worker that never heard of it; the worker calls this
    before its next claim. Not counted against ``max_attempts``.
    """
    with db.transaction():
        now = db.now(now)
        strays = [
            job
            for job in db.select(
                "state = ? AND worker = ?", (JobState.RUNNING.value, worker)
            )
            if job.id not in held
        ]
        return [
            db.write(
                job,
                JobEvent.REQUEUE,
                now=now,
                worker=worker,
                reason="claimed as the store went away; the worker never ran it",
                changes={"handbacks": job.handbacks + 1},
            )
            for job in strays
        ]


def _settle(
    db: Database,
    job: JobRecord,
    *,
    now: float,
    rescuer: str,
    why: str,
    unless_leased: bool = False,
) -> JobRecord:
    if job.state is JobState.RUNNING and job.cancel_requested_at is not None:
        job = db.write(
            job,
            JobEvent.CANCEL,
            now=now,
            worker=rescuer,
            reason=why,
            changes={},
            unless_leased=unless_leased,
        )
        unless_leased = False  # the row is this transaction's now
    changes: dict[str, Any] = {}
    if job.state is JobState.CANCELLING:
        event, changes = JobEvent.FINISH_CANCEL, {"error": "cancelled"}
    elif job.state is JobState.TIMING_OUT:
        event = JobEvent.FINISH_TIME_OUT
    elif job.attempts - job.handbacks >= job.max_attempts:
        event = JobEvent.FAIL
        changes = {
            "error": f"{why} on attempt {job.attempts}, the last of {job.max_attempts}"
        }
    else:
        event = JobEvent.REQUEUE
    return db.write(
        job,
        event,
        now=now,
        worker=rescuer,
        reason=why,
        changes=changes,
        unless_leased=unless_leased,
    )
