"""The async face of a job store: argument checks, the clock, and the thread hop.

`JobStore` checks every argument in the Trio thread, reads the clock there
(so that tests can run the store under Trio's mock clock), and runs the
store's synchronous operations (`_client`, `_holding`, `_leases`) in a
worker thread, one call at a time per connection; the endings of jobs are
committed in groups (`_groupcommit`). `open_store` (in `_open`) picks
the store from a URL.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, cast

import attrs
import trio

from . import _client, _holding, _leases
from ._exceptions import StoreError
from ._groupcommit import GroupCommits, StoreStatistics
from ._holding import ClaimRequest, GroupedEnding, Settled
from ._jobchecks import (
    check_count,
    check_duration,
    check_incarnation,
    check_job_id,
    check_text,
    check_timeout,
    claim_options,
)
from ._jsonrule import check_object
from ._records import AuditEvent, JobEnding, JobRecord
from ._serial import SerialCalls
from ._sql import Connection, Database
from ._states import JobEvent

P = ParamSpec("P")
R = TypeVar("R")

if TYPE_CHECKING:
    from typing_extensions import Self


@attrs.define(eq=False)
class JobStore:
    """Durable jobs in a database, for any number of workers and clients.

    Create one with `open_store`. All async methods are checkpoints; each
    runs its queries in one transaction, in a worker thread. Each checks its
    arguments first, the same way on every store: `TypeError` for a value of
    the wrong type, `ValueError` for one out of range (both naming the
    argument and the value), `JobNotFoundError` for an unknown job id, and
    `StoreError` once the store is closed. Nothing is written then.

    The constructor takes the store's ``Database``; ``clock``,
    called in the Trio thread, returns the current time in seconds
    (`time.time` by default); ``offload=False`` runs the queries in the Trio
    thread instead of a worker thread, which keeps a test under Trio's mock
    clock exact.
    """

    _db: Database
    _clock: Callable[[], float] = time.time
    _offload: bool = True
    _calls: SerialCalls = attrs.field(factory=SerialCalls, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    _endings: GroupCommits = attrs.field(init=False)
    # A second connection, for every query but the endings' groups (PostgreSQL,
    # once a worker runs several jobs: see reserve_connections).
    _side: Database | None = attrs.field(default=None, init=False)
    _side_calls: SerialCalls = attrs.field(factory=SerialCalls, init=False)

    def __attrs_post_init__(self) -> None:
        self._endings = GroupCommits(self._db, self._calls, self._offload)

    def now(self) -> float:
        """The store's current time. Not a checkpoint."""
        return self._clock()

    async def _call(
        self,
        fn: Callable[Concatenate[Database, P], R],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        if self._closed:
            raise StoreError("the job store is closed")
        db, calls = self._db, self._calls
        if self._side is not None:
            db, calls = self._side, self._side_calls
        call = functools.partial(fn, db, *args, **kwargs)
        return await calls.run(call, offload=self._offload)

    async def reserve_connections(self, *, concurrency: int) -> None:
        """Open the connections a worker running ``concurrency`` jobs needs.

        A SQLite store has one connection: one process writes the file at a
        time. A PostgreSQL store has one (and one that listens); for
        ``concurrency`` above 1 it opens a second, which carries every
        query but the groups of endings (`JobStore.statistics`): claims,
        lease renewals, progress, cancel requests, rescues and reads
        never wait behind a group's transaction. Above 1, on every store,
        an ending that takes the store's turn lets the endings already on
        their way join its group (see "Endings are committed in groups" in
        the how-to). Calling it again changes nothing. This is a checkpoint.

        Raises:
            Exception: psycopg's ``OperationalError`` if the server cannot
                be reached: an outage (`is_outage`), to retry.
        """
        concurrency = check_count(concurrency, argument="concurrency")
        if self._closed:
            raise StoreError("the job store is closed")
        if concurrency > 1:
            self._endings.gather = True
        if concurrency == 1 or self._side is not None or not self._offload:
            await trio.lowlevel.checkpoint()
            return
        another = await trio.to_thread.run_sync(self._db.connection.another)
        if another is not None:
            self._adopt(another)

    def _adopt(self, another: Connection) -> None:
        if self._closed or self._side is not None:  # closed, or raced, meanwhile
            another.close()
        else:
            self._side = Database(another)

    @property
    def listens(self) -> bool:
        """True if `wait_for_news` hears other processes (PostgreSQL)."""
        return self._db.listens and self._offload

    async def wait_for_news(self, timeout: float) -> list[str]:
        """Wait for a new job or a cancel request, for ``timeout`` seconds at most.

        Returns the news heard: ``"submitted"`` for a new job, ``"cancel
        ID"`` for a cancel request of job ``ID``; none after the timeout.
        Only for a store that `listens`; others raise `RuntimeError`. The
        wait runs in a thread, abandoned if cancelled. This is a checkpoint.
        """
        timeout = check_duration(timeout, argument="timeout")
        if not self.listens:
            raise RuntimeError("this store does not listen; poll it instead")
        if self._closed:
            raise StoreError("the job store is closed")
        return await trio.to_thread.run_sync(
            self._db.connection.wait_for_news, timeout, abandon_on_cancel=True
        )

    async def submit(
        self,
        kind: str,
        payload: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        max_attempts: int = 3,
    ) -> str:
        """Queue a new job and return its id.

        Every argument is checked before anything is written, the same way
        on every store.

        Args:
            kind (str): Which job function runs it: non-empty text without
                NUL.
            payload (dict or None): Its arguments, a JSON object: dicts with
                string keys, lists, strings, ints, finite floats, bools and
                None. None stands for ``{}``.
            timeout (float or None): Seconds one attempt may run.
            max_attempts (int): Attempts that may end with a dead worker,
                in ``1..2147483647``.

        Raises:
            TypeError: for an argument of the wrong type, or a payload that
                is not a mapping or holds a value JSON has not (the message
                gives its path).
            ValueError: for an empty kind or one with a NUL, a timeout that
                is not a positive finite number, ``max_attempts`` out of its
                range, or NaN or an infinity in the payload.
            StoreError: if the store is closed.
        """
        kind = check_text(kind, argument="kind")
        checked = {} if payload is None else check_object(payload, what="payload")
        timeout = check_timeout(timeout)
        max_attempts = check_count(max_attempts, argument="max_attempts")
        return await self._call(
            _client.submit,
            kind,
            checked,
            timeout=timeout,
            max_attempts=max_attempts,
            now=self.now(),
        )

    async def claim(
        self,
        worker: str,
        *,
        lease: float,
        stale_after: float | None = None,
        kinds: Collection[str] | None = None,
        incarnation: str | None = None,
    ) -> JobRecord | None:
        """Claim the oldest queued job for ``worker`` and renew its lease.

        The lease is extended to ``lease`` seconds from now if less than
        half of that is left (a worker renews it every third of it anyway).
        Only jobs of ``kinds`` are claimed (any kind for None); the others
        stay queued for a worker that knows them. ``stale_after`` is
        recorded with the job (`JobRecord.stale_after`). With
        ``incarnation``, the lease is renewed only if that process still
        holds the worker's id (see `take_over`).

        Raises:
            WorkerReplacedError: if another incarnation holds the id.
        """
        worker = check_text(worker, argument="worker")
        options = claim_options(lease, stale_after, kinds, incarnation)
        return await self._call(_holding.claim, worker, now=self.now(), **options)

    async def claim_many(
        self,
        worker: str,
        *,
        limit: int,
        lease: float,
        stale_after: float | None = None,
        kinds: Collection[str] | None = None,
        incarnation: str | None = None,
    ) -> list[JobRecord]:
        """Claim up to ``limit`` queued jobs, oldest first, in one transaction.

        As `claim` otherwise.
        """
        worker = check_text(worker, argument="worker")
        options = claim_options(lease, stale_after, kinds, incarnation)
        limit = check_count(limit, argument="limit")
        return await self._call(
            _holding.claim_many,
            worker,
            now=self.now(),
            limit=limit,
            **options,
        )

    async def finish_then_claim(
        self,
        job_id: str,
        event: JobEvent,
        *,
        worker: str,
        attempt: int,
        reason: str,
        traceback: str | None = None,
        limit: int,
        lease: float,
        stale_after: float | None,
        kinds: Collection[str] | None = None,
        incarnation: str | None,
        **changes: Any,
    ) -> tuple[JobRecord, list[JobRecord]]:
        """`finish`, then `claim_many`, in one transaction.

        Returns the finished job and the jobs claimed. One commit, where
        two calls would make two. Raises what `finish` raises, and
        `WorkerReplacedError` (writing nothing) if another process holds the
        worker's id. After an outage, both may have been written or neither
        (the answer can be lost with the connection).
        """
        options = claim_options(lease, stale_after, kinds, incarnation)
        ending = JobEnding(
            job_id=job_id,
            event=event,
            worker=worker,
            attempt=attempt,
            reason=reason,
            changes=changes,
            traceback=traceback,
        )
        claim = ClaimRequest(limit=check_count(limit, argument="limit"), **options)
        return await self._end(ending, claim)

    async def _end(self, ending: JobEnding, claim: ClaimRequest | None) -> Settled:
        if self._closed:
            raise StoreError("the job store is closed")
        return await self._endings.write(GroupedEnding(ending, self.now(), claim))

    def statistics(self) -> StoreStatistics:
        """A `StoreStatistics` snapshot: how the endings were grouped.

        Not a checkpoint.
        """
        return self._endings.statistics()

    async def take_over(
        self, worker: str, *, incarnation: str, lease: float
    ) -> list[JobRecord]:
        """Hold ``worker``'s id as the process ``incarnation``, at its start.

        An earlier process under the id is gone or about to stop (its next
        renewal raises `WorkerReplacedError`): the jobs the id held are
        settled at once, as a rescue settles those of an expired lease.
        Returns them.
        """
        return await self._call(
            _leases.take_over,
            check_text(worker, argument="worker"),
            now=self.now(),
            lease=check_duration(lease, argument="lease"),
            incarnation=check_text(incarnation, argument="incarnation"),
        )

    async def release_strays(
        self, worker: str, *, held: Collection[str]
    ) -> list[JobRecord]:
        """Queue again the running jobs of ``worker`` not in ``held``; return them.

        For a worker whose claim failed as the store went away: the claim
        may have been committed without the answer coming back.
        """
        return await self._call(
            _leases.release_strays,
            check_text(worker, argument="worker"),
            now=self.now(),
            held=held,  # a live view, read when the store's turn comes (Claims)
        )

    async def finish(
        self,
        job_id: str,
        event: JobEvent,
        *,
        worker: str,
        attempt: int,
        reason: str,
        traceback: str | None = None,
        **changes: Any,
    ) -> JobRecord:
        """Apply ``event`` to the job attempt that ``worker`` holds.

        ``traceback``, if given, is stored with the job (`JobRecord.traceback`).
        ``changes`` set the job's ``result``, ``progress``,
        ``failed_subtasks`` (JSON text), ``elapsed`` and ``error``.

        Raises:
            TypeError: if a keyword argument is not one of these (the
                message names it); nothing is written. Only these names,
                the store's own, reach the SQL statement.
            IllegalJobTransitionError: if the table does not allow it.
            LostJobError: if the attempt is no longer the worker's: it runs
                on a later attempt or under another worker, or another
                worker (or a client) has queued it again or ended it.
        """
        ending = JobEnding(
            job_id=job_id,
            event=event,
            worker=worker,
            attempt=attempt,
            reason=reason,
            changes=changes,
            traceback=traceback,
        )
        done, _ = await self._end(ending, None)
        return done

    async def save_progress(
        self, job_id: str, progress: Mapping[str, Any], *, worker: str, attempt: int
    ) -> None:
        """Persist a running job's progress and its heartbeat time.

        ``progress`` is a JSON object, checked as the payload of `submit`.
        """
        job_id = check_job_id(job_id)
        checked = check_object(progress, what="progress")
        worker = check_text(worker, argument="worker")
        attempt = check_count(attempt, argument="attempt")
        await self._call(
            _holding.save_progress,
            job_id,
            checked,
            worker=worker,
            attempt=attempt,
            now=self.now(),
        )

    async def request_cancel(self, job_id: str) -> JobRecord:
        """Ask for a job to be cancelled, from any process.

        A queued job is cancelled at once. For a running one the request is
        recorded; its worker serves it (`Worker`). A job already cancelling or
        ended is left as it is.

        Raises:
            TypeError: if ``job_id`` is not a string.
            JobNotFoundError: if there is no such job.
        """
        job_id = check_job_id(job_id)
        return await self._call(_client.request_cancel, job_id, now=self.now())

    async def cancel_requests(self, worker: str) -> list[str]:
        """Ids of the running jobs of ``worker`` whose cancellation was requested."""
        worker = check_text(worker, argument="worker")
        return await self._call(_holding.cancel_requests, worker)

    async def renew_lease(
        self, worker: str, *, lease: float, incarnation: str | None = None
    ) -> None:
        """Extend ``worker``'s lease to ``lease`` seconds from now.

        Raises:
            WorkerReplacedError: if ``incarnation`` is given and another one
                holds the id (see `take_over`).
        """
        await self._call(
            _leases.renew_lease,
            check_text(worker, argument="worker"),
            now=self.now(),
            lease=check_duration(lease, argument="lease"),
            incarnation=check_incarnation(incarnation),
        )

    async def drop_lease(self, worker: str) -> None:
        """Remove ``worker``'s lease: it holds no jobs any more."""
        worker = check_text(worker, argument="worker")
        await self._call(_leases.drop_lease, worker)

    async def leases(self) -> dict[str, float]:
        """When each live worker's lease expires, by worker id."""
        return await self._call(_leases.leases)

    async def rescue(self, *, rescuer: str) -> list[JobRecord]:
        """Settle the jobs of every worker whose lease has expired.

        ``cancelling`` becomes ``cancelled``, ``timing_out`` becomes
        ``timed_out``; a ``running`` job is queued again (its progress kept)
        or, after ``max_attempts``, failed. A job whose cancellation was
        requested is cancelled. Only an expired lease counts: a job's age
        never does. Returns the jobs changed.
        """
        rescuer = check_text(rescuer, argument="rescuer")
        return await self._call(_leases.rescue, now=self.now(), rescuer=rescuer)

    async def get(self, job_id: str) -> JobRecord:
        """The job's record.

        Raises:
            TypeError: if ``job_id`` is not a string.
            JobNotFoundError: if there is no such job.
        """
        job_id = check_job_id(job_id)
        return await self._call(Database.get, job_id)

    async def jobs(self, ids: Sequence[str] | None = None) -> list[JobRecord]:
        """The records of ``ids`` in that order, or of all jobs, oldest first.

        Clients read the status of their jobs with this.

        Raises:
            TypeError: if ``ids`` is not a sequence of strings (a string
                alone is not).
            JobNotFoundError: if one of ``ids`` is not a job of the store.
        """
        if ids is not None:
            if isinstance(ids, str) or not isinstance(cast("object", ids), Sequence):
                raise TypeError(f"ids must be a sequence of job ids, not {ids!r}")
            ids = [check_job_id(job_id) for job_id in ids]
        return await self._call(_client.jobs, ids)

    async def events(self, job_id: str | None = None) -> list[AuditEvent]:
        """The audit log, of one job or of all, oldest first.

        Raises:
            TypeError: if ``job_id`` is not a string or None.
            JobNotFoundError: if there is no such job.
        """
        if job_id is not None:
            job_id = check_job_id(job_id)
        return await self._call(_client.events, job_id)

    def is_outage(self, exc: BaseException) -> bool:
        """True if ``exc``, raised by this store, means it is away for now.

        Such an error (a lost connection, a lock held past the busy timeout,
        a disk refusing writes) goes away by itself: retry the operation
        later. Any other error is a bug. Not a checkpoint.
        """
        return self._db.connection.is_outage(exc)

    def check(self) -> None:
        """Raise `StoreGoneError` if the store's file was deleted or replaced.

        A no-op for PostgreSQL. Not a checkpoint.
        """
        self._db.connection.check()

    def close(self) -> None:
        """Close the database connection. Not a checkpoint.

        Every later operation raises `StoreError`; closing again does
        nothing.
        """
        if not self._closed:
            self._closed = True
            self._db.close()
            if self._side is not None:
                self._side.close()

    def __enter__(self) -> Self:
        """``with open_store(url) as store:`` closes the store after the block."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
