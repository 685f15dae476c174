"""The async face of a job store: argument checks, the clock, and the thread hop.

`JobStore` checks every argument in the Trio thread, reads the clock there
(so that tests can run the store under Trio's mock clock), and runs the
store's synchronous queries in a worker thread, one call at a time per
store. `open_store` picks the store from a URL.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar, cast

import attrs
import trio

from .._core._util import check_seconds
from ._checks import (
    check_count,
    check_duration,
    check_job_id,
    check_kinds,
    check_text,
    check_timeout,
)
from ._jsonrule import check_object
from ._postgres import PostgresQueries
from ._records import AuditEvent, JobRecord
from ._sql import SqlQueries, StoreError
from ._sqlite import SQLiteQueries
from ._states import JobEvent

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_STORE_URL: Final = "sqlite:///jobs.db"

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

    The constructor takes the store's synchronous operations; ``clock``,
    called in the Trio thread, returns the current time in seconds
    (`time.time` by default); ``offload=False`` runs the queries in the Trio
    thread instead of a worker thread, which keeps a test under Trio's mock
    clock exact.
    """

    _queries: SqlQueries
    _clock: Callable[[], float] = time.time
    _offload: bool = True
    _lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    _closed: bool = attrs.field(default=False, init=False)

    def now(self) -> float:
        """The store's current time. Not a checkpoint."""
        return self._clock()

    async def _call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        if self._closed:
            raise StoreError("the job store is closed")
        async with self._lock:
            if not self._offload:
                await trio.lowlevel.checkpoint()
                return fn(*args, **kwargs)
            return await trio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    @property
    def listens(self) -> bool:
        """True if `wait_for_news` hears other processes (PostgreSQL)."""
        return self._queries.listens and self._offload

    async def wait_for_news(self, timeout: float) -> None:
        """Wait for a new job or a cancel request, for ``timeout`` seconds at most.

        Only for a store that `listens`; others raise `RuntimeError`. The
        wait runs in a thread, abandoned if cancelled. This is a checkpoint.
        """
        timeout = check_duration(timeout, argument="timeout")
        if not self.listens:
            raise RuntimeError("this store does not listen; poll it instead")
        if self._closed:
            raise StoreError("the job store is closed")
        await trio.to_thread.run_sync(
            self._queries.wait_for_news, timeout, abandon_on_cancel=True
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
            self._queries.submit,
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
    ) -> JobRecord | None:
        """Claim the oldest queued job for ``worker`` and renew its lease.

        Only jobs of ``kinds`` are claimed (any kind for None); the others
        stay queued for a worker that knows them. ``stale_after`` is
        recorded with the job (`JobRecord.stale_after`).
        """
        worker = check_text(worker, argument="worker")
        lease = check_duration(lease, argument="lease")
        if stale_after is not None:
            stale_after = check_seconds("stale_after", stale_after)
        return await self._call(
            self._queries.claim,
            worker,
            now=self.now(),
            lease=lease,
            stale_after=stale_after,
            kinds=check_kinds(kinds),
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

        Raises:
            IllegalJobTransitionError: if the table does not allow it.
            LostJobError: if the attempt is no longer the worker's.
        """
        job_id = check_job_id(job_id)
        worker = check_text(worker, argument="worker")
        attempt = check_count(attempt, argument="attempt")
        reason = check_text(reason, argument="reason", empty=True)
        if traceback is not None:
            traceback = check_text(traceback, argument="traceback")
        return await self._call(
            self._queries.finish,
            job_id,
            event,
            worker=worker,
            attempt=attempt,
            now=self.now(),
            reason=reason,
            traceback=traceback,
            changes=changes,
        )

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
            self._queries.save_progress,
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
        return await self._call(self._queries.request_cancel, job_id, now=self.now())

    async def cancel_requests(self, worker: str) -> list[str]:
        """Ids of the running jobs of ``worker`` whose cancellation was requested."""
        worker = check_text(worker, argument="worker")
        return await self._call(self._queries.cancel_requests, worker)

    async def renew_lease(self, worker: str, *, lease: float) -> None:
        """Extend ``worker``'s lease to ``lease`` seconds from now."""
        worker = check_text(worker, argument="worker")
        lease = check_duration(lease, argument="lease")
        await self._call(self._queries.renew_lease, worker, now=self.now(), lease=lease)

    async def drop_lease(self, worker: str) -> None:
        """Remove ``worker``'s lease: it holds no jobs any more."""
        worker = check_text(worker, argument="worker")
        await self._call(self._queries.drop_lease, worker)

    async def leases(self) -> dict[str, float]:
        """When each live worker's lease expires, by worker id."""
        return await self._call(self._queries.leases)

    async def rescue(self, *, rescuer: str) -> list[JobRecord]:
        """Settle the jobs of every worker whose lease has expired.

        ``cancelling`` becomes ``cancelled``, ``timing_out`` becomes
        ``timed_out``; a ``running`` job is queued again (its progress kept)
        or, after ``max_attempts``, failed. A job whose cancellation was
        requested is cancelled. Only an expired lease counts: a job's age
        never does. Returns the jobs changed.
        """
        rescuer = check_text(rescuer, argument="rescuer")
        return await self._call(self._queries.rescue, now=self.now(), rescuer=rescuer)

    async def get(self, job_id: str) -> JobRecord:
        """The job's record.

        Raises:
            TypeError: if ``job_id`` is not a string.
            JobNotFoundError: if there is no such job.
        """
        job_id = check_job_id(job_id)
        return await self._call(self._queries.get, job_id)

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
        return await self._call(self._queries.jobs, ids)

    async def events(self, job_id: str | None = None) -> list[AuditEvent]:
        """The audit log, of one job or of all, oldest first.

        Raises:
            TypeError: if ``job_id`` is not a string or None.
            JobNotFoundError: if there is no such job.
        """
        if job_id is not None:
            job_id = check_job_id(job_id)
        return await self._call(self._queries.events, job_id)

    def close(self) -> None:
        """Close the database connection. Not a checkpoint.

        Every later operation raises `StoreError`; closing again does
        nothing.
        """
        if not self._closed:
            self._closed = True
            self._queries.close()

    def __enter__(self) -> Self:
        """``with open_store(url) as store:`` closes the store after the block."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_store(
    url: str = DEFAULT_STORE_URL,
    *,
    clock: Callable[[], float] = time.time,
    offload: bool = True,
) -> JobStore:
    """Open the job store at ``url``, creating its tables if needed. Not a checkpoint.

    Args:
        url (str): ``sqlite:///path/to/file.db`` (a relative path after the
            three slashes, an absolute one after four), or a PostgreSQL
            connection URL ``postgresql://user@host/database`` (needs the
            ``postgres`` extra).
        clock: As for `JobStore`.
        offload (bool): As for `JobStore`.

    Raises:
        TypeError: if ``url`` is not a string.
        ValueError: if ``url`` is not a store URL.
        StoreError: if the file is not a SQLite database, the server cannot
            be reached, or psycopg is not installed.
    """
    if not isinstance(cast("object", url), str):
        raise TypeError(f"store URL must be a string, not {url!r}")
    prefix = "sqlite:///"
    if url.startswith(prefix) and len(url) > len(prefix):
        return JobStore(SQLiteQueries(url[len(prefix) :]), clock, offload)
    if url.startswith(("postgresql://", "postgres://")):
        return JobStore(PostgresQueries(url), clock, offload)
    raise ValueError(
        "store URL must look like sqlite:///path/to/file.db or "
        f"postgresql://host/database, not {url!r}"
    )
