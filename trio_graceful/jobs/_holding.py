"""A worker's writes to the jobs it holds: claiming, progress, endings.

What a worker calls while it runs jobs, each operation in one transaction
of a `Database`. A worker that finishes a job while it has a free slot
settles the job and claims the next ones in the same transaction
(`finish_then_claim`): one commit, and so one flush to disk, where a
settlement and a claim apart would take two. The endings of jobs that end
together, with their claims, are one transaction too (`finish_group`,
gathered by `_groupcommit`). A claim changes the rows it picked in one
statement, and writes their audit rows in one more.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import outcome

from ._exceptions import IllegalJobTransitionError, LostJobError, WorkerReplacedError
from ._leases import lost_job_error, renew
from ._records import JobEnding, JobRecord
from ._schema import COLUMNS, record, updated
from ._sql import Database
from ._states import JOB_TABLE, JobEvent, JobState


def claim(
    db: Database,
    worker: str,
    *,
    now: float,
    lease: float,
    stale_after: float | None,
    incarnation: str | None = None,
    kinds: Sequence[str] | None = None,
) -> JobRecord | None:
    """Claim the oldest queued job of ``kinds`` (None: any), if there is one."""
    jobs = claim_many(
        db,
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
    db: Database,
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
    with db.transaction():
        now = db.now(now)
        _renew_for_claims(db, worker, now, lease, incarnation)
        return _claim(db, worker, now, stale_after, kinds, limit)


def finish(db: Database, ending: JobEnding, *, now: float) -> JobRecord:
    """Write ``ending``, a transition by the worker that holds the attempt."""
    [written] = finish_group(db, [GroupedEnding(ending, now, None)])
    return written.unwrap()[0]


def finish_then_claim(
    db: Database,
    ending: JobEnding,
    *,
    now: float,
    lease: float,
    stale_after: float | None,
    incarnation: str | None = None,
    kinds: Sequence[str] | None = None,
    limit: int,
) -> Settled:
    """`finish`, then `claim_many` for the same worker, committed together.

    The lease is renewed first: if another process holds the worker's
    id (`WorkerReplacedError`), nothing is written. Its take-over has
    settled the job already; the ending is not this process's to write.
    """
    claim = ClaimRequest(
        limit=limit,
        lease=lease,
        stale_after=stale_after,
        incarnation=incarnation,
        kinds=kinds,
    )
    [written] = finish_group(db, [GroupedEnding(ending, now, claim)])
    return written.unwrap()


@attrs.frozen(kw_only=True)
class ClaimRequest:
    """The claim that goes with an ending: up to ``limit`` jobs for its slots."""

    limit: int
    lease: float
    stale_after: float | None
    incarnation: str | None
    kinds: Sequence[str] | None


@attrs.frozen
class GroupedEnding:
    """One ending of a group (`finish_group`): what, when, and the claim with it."""

    ending: JobEnding
    now: float
    """The caller's clock when the ending was asked for."""
    claim: ClaimRequest | None


Settled = tuple[JobRecord, list[JobRecord]]

# What refuses one ending of a group, before anything of it is written: the
# others go on.
_REFUSALS = (LostJobError, IllegalJobTransitionError, WorkerReplacedError)


def finish_group(
    db: Database, group: Sequence[GroupedEnding]
) -> list[outcome.Outcome[Settled]]:
    """Write the endings of ``group``, then their claims, in one transaction.

    Each is written as `finish_then_claim` (or `finish`, without a claim)
    would write it alone; the claims of one worker are one query. An ending
    the store refuses (`LostJobError`, `IllegalJobTransitionError`,
    `WorkerReplacedError`) is refused before anything of it is written, and
    gets its error; the others are committed. Any other error (an outage, a
    bug) rolls the whole group back, and every ending gets it. Returns each
    ending's outcome, in order.
    """
    refused: dict[int, BaseException] = {}
    done: dict[int, JobRecord] = {}
    claimed: dict[int, list[JobRecord]] = {}
    try:
        with db.transaction():
            clock = db.now(0.0) if db.dialect.clock is not None else None
            renewed: dict[tuple[str, str | None, float], WorkerReplacedError | None]
            renewed = {}
            claims: dict[tuple[Any, ...], tuple[float, list[tuple[int, int]]]] = {}
            for k, member in enumerate(group):
                now = member.now if clock is None else clock
                request, ending = member.claim, member.ending
                try:
                    if request is not None:
                        key = (ending.worker, request.incarnation, request.lease)
                        if key not in renewed:
                            renewed[key] = _renew_or_error(
                                db, ending.worker, now, request
                            )
                        replaced = renewed[key]
                        if replaced is not None:
                            raise replaced
                    done[k] = _finish(db, ending, now)
                except _REFUSALS as exc:
                    refused[k] = exc
                    continue
                if request is not None and request.limit:
                    kinds = None if request.kinds is None else tuple(request.kinds)
                    wanted = (ending.worker, request.stale_after, kinds)
                    claims.setdefault(wanted, (now, []))[1].append((k, request.limit))
            for (worker, stale_after, kinds), (now, wanting) in claims.items():
                total = sum(limit for _, limit in wanting)
                jobs = _claim(db, worker, now, stale_after, kinds, total)
                for k, limit in wanting:
                    claimed[k], jobs = jobs[:limit], jobs[limit:]
    except Exception as exc:
        # The whole group was rolled back, or its commit is unknown.
        return [outcome.Error(exc) for _ in group]
    return [
        outcome.Error(refused[k])
        if k in refused
        else outcome.Value((done[k], claimed.get(k, [])))
        for k in range(len(group))
    ]


def _renew_or_error(
    db: Database, worker: str, now: float, request: ClaimRequest
) -> WorkerReplacedError | None:
    try:
        _renew_for_claims(db, worker, now, request.lease, request.incarnation)
    except WorkerReplacedError as exc:
        return exc
    return None


def _renew_for_claims(
    db: Database, worker: str, now: float, lease: float, incarnation: str | None
) -> None:
    # The worker renews its lease every third of it: a claim extends a
    # lease only if that fell behind (after an outage, say), and
    # otherwise leaves the row, and its page on disk, untouched.
    renew(
        db, worker, now + lease, incarnation=incarnation, unless_after=now + lease / 2
    )


def save_progress(
    db: Database,
    job_id: str,
    progress: Mapping[str, Any],
    *,
    worker: str,
    attempt: int,
    now: float,
) -> None:
    """Write a running job's progress and its heartbeat time."""
    with db.transaction():
        now = db.now(now)
        job = _holds(db, db.get(job_id, lock=True), worker, attempt)
        # A job being cancelled runs on until it stops: its progress
        # shows. A late write never changes an ending.
        if job.state not in (JobState.RUNNING, JobState.CANCELLING):
            return
        db.execute(
            "UPDATE jobs SET progress = ?, last_heartbeat_at = ? WHERE id = ?",
            (json.dumps(dict(progress)), now, job_id),
        )


def _claim(
    db: Database,
    worker: str,
    now: float,
    stale_after: float | None,
    kinds: Sequence[str] | None,
    limit: int,
) -> list[JobRecord]:
    of_kinds = "" if kinds is None else f" AND kind IN ({', '.join('?' * len(kinds))})"
    rows = db.execute(
        f"SELECT {COLUMNS} FROM jobs WHERE state = ?{of_kinds} "
        f"ORDER BY created_at, {db.dialect.order_column} LIMIT ?{db.dialect.lock_rows}",
        (JobState.QUEUED.value, *(kinds or ()), limit),
    )
    jobs = [record(row) for row in rows]
    for start in range(0, len(jobs), _ROWS_PER_STATEMENT):
        chunk = jobs[start : start + _ROWS_PER_STATEMENT]
        _mark_claimed(db, chunk, worker, now, stale_after)
    running = JOB_TABLE.move(JobState.QUEUED, JobEvent.CLAIM, subject="a claim")
    return [
        updated(
            job,
            {
                "state": running.value,
                "attempts": job.attempts + 1,
                "worker": worker,
                "started_at": now,
                "stale_after": stale_after,
                "elapsed": None,
            },
            at=now,
        )
        for job in jobs
    ]


def _attempt(job: JobRecord) -> str:
    return f"attempt {job.attempts + 1}"


# Rows one claim's statement changes at most: 6 values each in the audit
# rows' INSERT, well under SQLite's 32,766 variables.
_ROWS_PER_STATEMENT = 500


def _mark_claimed(
    db: Database,
    jobs: Sequence[JobRecord],
    worker: str,
    now: float,
    stale_after: float | None,
) -> None:
    """Claim ``jobs``, read queued and locked: one UPDATE, one INSERT of audit rows.

    A statement per claim, not per job: the rows were picked and locked by
    this transaction, so each is changed as it was read.
    """
    ids = [job.id for job in jobs]
    marks = ", ".join("?" * len(ids))
    running, queued = JobState.RUNNING.value, JobState.QUEUED.value
    changed = db.update(
        "UPDATE jobs SET state = ?, attempts = attempts + 1, worker = ?, "
        "started_at = ?, stale_after = ?, elapsed = NULL "
        f"WHERE state = ? AND id IN ({marks})",
        (running, worker, now, stale_after, queued, *ids),
    )
    if changed != len(ids):  # the rows are this transaction's: a bug
        raise LostJobError(f"{len(ids)} jobs picked to claim, {changed} claimed")
    db.execute(
        "INSERT INTO job_events (job, source, target, at, worker, reason) VALUES "
        + ", ".join("(?, ?, ?, ?, ?, ?)" for _ in jobs),
        [
            value
            for job in jobs
            for value in (job.id, queued, running, now, worker, _attempt(job))
        ],
    )


def _finish(db: Database, ending: JobEnding, now: float) -> JobRecord:
    job_id, event = ending.job_id, ending.event
    job = _holds(db, db.get(job_id, lock=True), ending.worker, ending.attempt)
    JOB_TABLE.move(job.state, event, subject=f"job {job_id}")
    changes = ending.changes
    if event is JobEvent.REQUEUE:
        # A hand-back at shutdown is not a failed attempt.
        changes = {**changes, "handbacks": job.handbacks + 1}
    if event is JobEvent.TIME_OUT:
        changes = {**changes, "timed_out_at": now}
    if ending.traceback is not None:
        db.execute(
            "INSERT INTO job_tracebacks (job, traceback) VALUES (?, ?) "
            "ON CONFLICT (job) DO UPDATE SET traceback = excluded.traceback",
            (job_id, ending.traceback),
        )
        job = attrs.evolve(job, traceback=ending.traceback)
    return db.write(
        job, event, now=now, worker=ending.worker, reason=ending.reason, changes=changes
    )


def _holds(db: Database, job: JobRecord, worker: str, attempt: int) -> JobRecord:
    """Return ``job`` if its attempt ``attempt`` is still ``worker``'s.

    Raises:
        LostJobError: naming where the job is now (`lost_job_error`).
    """
    lost = lost_job_error(
        job, worker, attempt, set_by=functools.partial(_set_by, db, job.id)
    )
    if lost is not None:
        raise lost
    return job


def _set_by(db: Database, job_id: str) -> str | None:
    """The worker that wrote the job's last transition (None: a client)."""
    rows = db.execute(
        "SELECT worker FROM job_events WHERE job = ? ORDER BY seq DESC LIMIT 1",
        (job_id,),
    )
    return rows[0][0] if rows else None


def cancel_requests(db: Database, worker: str) -> list[str]:
    """Ids of the running jobs of ``worker`` whose cancellation was requested."""
    rows = db.execute(
        "SELECT id FROM jobs WHERE worker = ? AND state = ? "
        "AND cancel_requested_at IS NOT NULL ORDER BY id",
        (worker, JobState.RUNNING.value),
    )
    return [row[0] for row in rows]
