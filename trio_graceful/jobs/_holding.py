"""A worker's writes to the jobs it holds: claiming, progress, endings.

What a worker calls while it runs jobs, each operation in one transaction
of a `Database`. A worker that finishes a job while it has a free slot
settles the job and claims the next ones in the same transaction (the
ending's `ClaimRequest`): one commit, and so one flush to disk, where a
settlement and a claim apart would take two. The endings of jobs that end
together, with their claims, are one transaction too (`finish_group`,
gathered by `_groupcommit`). A claim picks and changes its rows in one
statement; a group's endings read their rows in one statement and change
them in one per set of columns; the audit rows of a transaction are one
INSERT. The statements are sent before the answers are read wherever the
answers are not needed yet (`Database.send`): on PostgreSQL, a group with
its claims takes three round trips to the server, the commit's included.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import outcome

from .._core._log import plural
from ._exceptions import (
    IllegalJobTransitionError,
    JobNotFoundError,
    LostJobError,
    WorkerReplacedError,
)
from ._leases import lost_job_error, read_holder, renew
from ._records import JobEnding, JobRecord
from ._schema import COLUMNS, record, updated
from ._sql import Database, Reply, transition
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
        clock, holder = db.send_now(now), read_holder(db, worker)
        now = clock()
        _renew_for_claims(db, worker, now, lease, incarnation, holder)
        events: list[tuple[Any, ...]] = []
        jobs = _claim(db, worker, now, stale_after, kinds, limit, events)
        _insert_rows(db, _EVENTS, events)
        return jobs


def finish(db: Database, ending: JobEnding, *, now: float) -> JobRecord:
    """Write ``ending``, a transition by the worker that holds the attempt."""
    [written] = finish_group(db, [GroupedEnding(ending, now, None)])
    return written.unwrap()[0]


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

    Each is written as it would be in a transaction of its own; the claims
    of one worker are one query. An ending the store refuses
    (`LostJobError`, `IllegalJobTransitionError`, `WorkerReplacedError`) is
    refused before anything of it is written, and gets its error; the
    others are committed. Any other error (an outage, a bug) rolls the whole
    group back, and every ending gets it. Returns each ending's outcome, in
    order.

    The statements are as many for a group as for one ending: the read
    of each worker's lease and of the rows (sent together), the lease's
    renewal if it is due, the rows' changes (`_finish_batch`), each
    worker's claim, and the audit rows.
    """
    refused: dict[int, BaseException] = {}
    done: dict[int, JobRecord] = {}
    claimed: dict[int, list[JobRecord]] = {}
    try:
        with db.transaction():
            # The reads are sent together: the clock, the holders of the
            # renewing workers' ids, and the rows of the first batch.
            clock = db.send_now(0.0) if db.dialect.clock is not None else None
            holders = {
                member.ending.worker: read_holder(db, member.ending.worker)
                for member in group
                if member.claim is not None
            }
            batches = _batches(group)
            first = _read_locked(db, group, batches[0])
            now = None if clock is None else clock()
            times = [member.now if now is None else now for member in group]
            renewed: dict[tuple[str, str | None, float], WorkerReplacedError | None]
            renewed = {}
            for k, member in enumerate(group):
                request, worker = member.claim, member.ending.worker
                if request is not None:
                    key = (worker, request.incarnation, request.lease)
                    if key not in renewed:
                        renewed[key] = _renew_or_error(
                            db, worker, times[k], request, holders[worker]
                        )
                    replaced = renewed[key]
                    if replaced is not None:
                        refused[k] = replaced
            checks: list[tuple[Reply, int]] = []
            events: list[tuple[Any, ...]] = []  # audit rows, one INSERT at the end
            for batch in batches:
                if batch is not batches[0]:
                    # It reads what the batch before it wrote, audit rows too.
                    _insert_rows(db, _EVENTS, events)
                    events = []
                read = first if batch is batches[0] else _read_locked(db, group, batch)
                endings = [(k, group[k].ending, times[k]) for k in batch]
                done.update(_finish_batch(db, endings, read, refused, checks, events))
            claims: dict[tuple[Any, ...], tuple[float, list[tuple[int, int]]]] = {}
            for k in sorted(done):
                request, worker = group[k].claim, group[k].ending.worker
                if request is not None and request.limit:
                    kinds = None if request.kinds is None else tuple(request.kinds)
                    wanted = (worker, request.stale_after, kinds)
                    claims.setdefault(wanted, (times[k], []))[1].append(
                        (k, request.limit)
                    )
            for (worker, stale_after, kinds), (at, wanting) in claims.items():
                total = sum(limit for _, limit in wanting)
                jobs = _claim(db, worker, at, stale_after, kinds, total, events)
                for k, limit in wanting:
                    claimed[k], jobs = jobs[:limit], jobs[limit:]
            _insert_rows(db, _EVENTS, events)
            for reply, expected in checks:
                if reply.count() != expected:  # the rows are this transaction's
                    raise LostJobError(
                        f"{plural(expected, 'ending')} to write, "
                        f"{reply.count()} written"
                    )
    except Exception as exc:
        # The whole group was rolled back, or its commit is unknown.
        return [outcome.Error(exc) for _ in group]
    return [
        outcome.Error(refused[k])
        if k in refused
        else outcome.Value((done[k], claimed.get(k, [])))
        for k in range(len(group))
    ]


def _batches(group: Sequence[GroupedEnding]) -> list[list[int]]:
    """The endings of ``group`` by number, in batches of distinct jobs, in order.

    A job ended twice in a group (the second is refused, or writes over the
    first) starts the next batch, which reads what the first one wrote.
    """
    batches: list[list[int]] = [[]]
    for k, member in enumerate(group):
        if any(group[j].ending.job_id == member.ending.job_id for j in batches[-1]):
            batches.append([])
        batches[-1].append(k)
    return batches


def _renew_or_error(
    db: Database, worker: str, now: float, request: ClaimRequest, holder: Reply
) -> WorkerReplacedError | None:
    try:
        _renew_for_claims(db, worker, now, request.lease, request.incarnation, holder)
    except WorkerReplacedError as exc:
        return exc
    return None


def _renew_for_claims(
    db: Database,
    worker: str,
    now: float,
    lease: float,
    incarnation: str | None,
    holder: Reply,
) -> None:
    # The worker renews its lease every third of it: a claim extends a
    # lease only if that fell behind (after an outage, say), and
    # otherwise leaves the row, and its page on disk, untouched.
    renew(
        db,
        worker,
        now + lease,
        incarnation=incarnation,
        unless_after=now + lease / 2,
        holder=holder,
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
    events: list[tuple[Any, ...]],
) -> list[JobRecord]:
    """Claim up to ``limit`` of the oldest queued jobs of ``kinds`` (None: any).

    One UPDATE picks the rows (skipping those that other transactions
    lock) and changes them; their audit rows are added to ``events``, for
    the caller to write.
    """
    of_kinds = "" if kinds is None else f" AND kind IN ({', '.join('?' * len(kinds))})"
    order = db.dialect.order_column
    queued = JobState.QUEUED.value
    running = JOB_TABLE.move(JobState.QUEUED, JobEvent.CLAIM, subject="a claim").value
    # The state and the limit (an int) are written out, not parameters: the
    # plan PostgreSQL makes for them once, reading the index of states in
    # order, serves every later claim of as many jobs, without planning again.
    rows = db.execute(
        "UPDATE jobs SET state = ?, attempts = attempts + 1, worker = ?, "
        "started_at = ?, stale_after = ?, elapsed = NULL "
        f"WHERE id IN (SELECT id FROM jobs WHERE state = '{queued}'{of_kinds} "
        f"ORDER BY created_at, {order} LIMIT {int(limit)}{db.dialect.lock_rows}) "
        f"RETURNING {COLUMNS}, {order}",
        (running, worker, now, stale_after, *(kinds or ())),
    )
    # RETURNING keeps no order: the oldest first, as they were picked.
    rows.sort(key=lambda row: (row[_CREATED_AT], row[-1]))
    jobs = [record(row) for row in rows]
    events.extend(
        (job.id, queued, running, now, worker, f"attempt {job.attempts}")
        for job in jobs
    )
    return jobs


# The audit log, and the columns of an audit row.
_EVENTS = "job_events (job, source, target, at, worker, reason)"
# Where `COLUMNS` has created_at.
_CREATED_AT = 9
# Rows one INSERT writes at most: 6 values each in the audit rows' INSERT,
# well under SQLite's 32,766 variables.
_ROWS_PER_STATEMENT = 500


def _insert_rows(
    db: Database, into: str, rows: Sequence[Sequence[Any]], *, suffix: str = ""
) -> None:
    """INSERT ``rows`` ``into`` a table: one statement (up to `_ROWS_PER_STATEMENT`)."""
    if not rows:
        return
    for start in range(0, len(rows), _ROWS_PER_STATEMENT):
        chunk = rows[start : start + _ROWS_PER_STATEMENT]
        db.send(  # the answer is not needed: it goes with the next statement
            f"INSERT INTO {into} VALUES "
            + ", ".join("(" + ", ".join("?" * len(row)) + ")" for row in chunk)
            + suffix,
            [value for row in chunk for value in row],
        )


def _finish_batch(
    db: Database,
    endings: Sequence[tuple[int, JobEnding, float]],
    read: Reply,
    refused: dict[int, BaseException],
    checks: list[tuple[Reply, int]],
    events: list[tuple[Any, ...]],
) -> dict[int, JobRecord]:
    """Write ``endings`` of distinct jobs (each numbered, with its time).

    ``read`` brings their rows, read and locked (`_read_locked`). Each
    ending is checked here; a refused one gets its error in ``refused``
    before anything of it is written (one already refused is left out).
    The others are changed in one statement per set of columns, their
    tracebacks in one INSERT; their audit rows go in ``events``, and what
    each UPDATE must change in ``checks``, for the end of the transaction.
    Returns the endings written, by number.

    Raises:
        JobNotFoundError: naming the first job of ``endings`` that does
            not exist.
    """
    held = {job.id: job for job in map(record, read.rows())}
    done: dict[int, JobRecord] = {}
    changes: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
    tracebacks: list[tuple[str, str]] = []
    for k, ending, now in endings:
        if k in refused:
            continue
        if ending.job_id not in held:
            raise JobNotFoundError(f"no job with id {ending.job_id!r}")
        try:
            job, target, columns = _check_ending(db, held[ending.job_id], ending, now)
        except _REFUSALS as exc:
            refused[k] = exc
            continue
        names = tuple(columns)
        where = (job.id, job.state.value, job.attempts)
        changes.setdefault(names, []).append((*columns.values(), *where))
        source = job.state.value
        events.append((job.id, source, target.value, now, ending.worker, ending.reason))
        if ending.traceback is not None:
            tracebacks.append((job.id, ending.traceback))
            job = attrs.evolve(job, traceback=ending.traceback)
        done[k] = updated(job, columns, at=now)
    if tracebacks:
        _insert_rows(
            db,
            "job_tracebacks (job, traceback)",
            tracebacks,
            suffix=" ON CONFLICT (job) DO UPDATE SET traceback = excluded.traceback",
        )
    for names, rows in changes.items():
        assignments = ", ".join(f"{name} = ?" for name in names)
        reply = db.send_many(
            f"UPDATE jobs SET {assignments} "
            "WHERE id = ? AND state = ? AND attempts = ?",
            rows,
        )
        checks.append((reply, len(rows)))
    return done


def _read_locked(
    db: Database, group: Sequence[GroupedEnding], batch: Sequence[int]
) -> Reply:
    """Send the read of the jobs that ``batch`` of ``group`` ends, locked by id.

    In id order, the order every group locks in.
    """
    ids = sorted({group[k].ending.job_id for k in batch})
    return db.send(
        f"SELECT {COLUMNS} FROM jobs WHERE id IN ({', '.join('?' * len(ids))}) "
        f"ORDER BY id{db.dialect.lock_row}",
        ids,
    )


def _check_ending(
    db: Database, job: JobRecord, ending: JobEnding, now: float
) -> tuple[JobRecord, JobState, dict[str, Any]]:
    """What ``ending`` writes to ``job``: its target and the columns it sets.

    Raises:
        LostJobError: if the attempt is no longer the worker's.
        IllegalJobTransitionError: if the table does not allow the ending.
    """
    job = _holds(db, job, ending.worker, ending.attempt)
    changes = ending.changes
    if ending.event is JobEvent.REQUEUE:
        # A hand-back at shutdown is not a failed attempt.
        changes = {**changes, "handbacks": job.handbacks + 1}
    if ending.event is JobEvent.TIME_OUT:
        changes = {**changes, "timed_out_at": now}
    target, columns = transition(job, ending.event, now=now, changes=changes)
    return job, target, columns


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
