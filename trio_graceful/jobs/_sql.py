"""The one place where the job store's statements run, in a database's dialect.

The store's operations (`_client`, `_holding`, `_leases`) are functions
written once for every SQL database, in ``?`` placeholders; each is given
a `Database`: a driver's `Connection` and its `Dialect`, the value that says
how the SQL differs (placeholders, how a claim locks its rows, which
column breaks ties, the column types, whose clock is "now", how news is
announced). `Database.execute` renders a statement in the dialect and runs
it on the connection: nothing else runs SQL.

Every operation runs in one transaction that takes the locks it needs
before it reads, so that two workers cannot claim one job and a transition
and its audit row are committed together or not at all. `JobStore` calls
the operations from a worker thread, one at a time per connection.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, Protocol

import attrs

from ._exceptions import JobNotFoundError, LostJobError
from ._records import JobRecord
from ._schema import COLUMNS, SCHEMA, WRITABLE, record, updated
from ._states import JOB_TABLE, JobEvent, JobState


@attrs.frozen
class Dialect:
    """How one database's SQL differs from the statements as written."""

    placeholder: str
    """What the driver takes for ``?``."""
    order_column: str
    """The column that orders jobs submitted in the same instant."""
    lock_row: str
    """Appended to the SELECT of a row about to change."""
    lock_rows: str
    """Appended to the SELECT that picks rows to claim or rescue: rows
    another transaction holds are skipped, not waited for."""
    real: str
    """The column type of seconds."""
    serial: str
    """The column type of the audit log's increasing key."""
    clock: str | None = None
    """The query of the database's own time, if it is the one recorded."""
    notify: str | None = None
    """The statement that announces news (``?``) to listening workers."""

    def render(self, sql: str) -> str:
        """``sql`` with the driver's placeholders."""
        # Statements are built from this package's constants only, never
        # from input: no ``?`` stands anywhere but for an argument.
        return sql.replace("?", self.placeholder)

    def schema(self) -> str:
        """The script that creates the store's tables and indexes, if missing."""
        return SCHEMA.format(real=self.real, serial=self.serial)


class Reply(Protocol):
    """The answer to a statement sent (`Connection.send`), read when needed."""

    def rows(self) -> list[tuple[Any, ...]]:
        """The statement's rows (waits for them)."""
        ...

    def count(self) -> int:
        """How many rows the statement changed (waits for the answer)."""
        ...


@attrs.frozen
class Answered:
    """A `Reply` that came at once: the statement ran when it was sent."""

    _rows: list[tuple[Any, ...]]
    _count: int

    def rows(self) -> list[tuple[Any, ...]]:
        return self._rows

    def count(self) -> int:
        return self._count


class Connection(Protocol):
    """A driver's connection to the store, as `Database` uses it."""

    dialect: ClassVar[Dialect]
    """The connection's SQL dialect."""

    def send(self, sql: str, args: Sequence[Any]) -> Reply:
        """Send one statement, rendered; its answer is read from the `Reply`.

        In a transaction, a driver may send statements together until an
        answer is asked for (PostgreSQL's pipeline: one round trip for
        them all); an error of any of them is raised then, or by `commit`.
        """
        ...

    def send_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> Reply:
        """Send one ``UPDATE``, rendered, for each of ``rows``.

        The `Reply` counts the rows changed by them all.
        """
        ...

    def another(self) -> Connection | None:
        """A second connection to the same store, or None if one is all it serves.

        The tables exist already; an error opening it is an outage.
        """
        ...

    def begin(self) -> None:
        """Begin a transaction that serializes with other writers' claims."""
        ...

    def commit(self) -> None:
        """Commit the transaction, once every statement sent has succeeded."""
        ...

    def rollback(self) -> None:
        """End the failed transaction, if the connection still has one."""
        ...

    def check(self) -> None:
        """Raise `StoreGoneError` if the store is no longer where it was opened."""
        ...

    def is_outage(self, exc: BaseException) -> bool:
        """True if ``exc`` means the store is away for now, not a bug (`_outages`)."""
        ...

    def wait_for_news(self, timeout: float) -> list[str]:
        """Block until another process notifies, or ``timeout`` seconds pass.

        Returns the news heard (none after the timeout).
        """
        ...

    def close(self) -> None:
        """Close the connection."""
        ...


@attrs.define(eq=False)
class Database:
    """A connection in its dialect, and the steps every operation shares.

    Calls must not overlap.
    """

    connection: Connection
    dialect: Dialect = attrs.field(init=False)
    """The connection's SQL dialect."""
    _native: bool = attrs.field(init=False)
    """Whether the driver takes the statements' ``?`` as they are."""

    def __attrs_post_init__(self) -> None:
        self.dialect = self.connection.dialect
        self._native = self.dialect.placeholder == "?"

    @property
    def listens(self) -> bool:
        """Whether `Connection.wait_for_news` hears other processes (else poll)."""
        return self.dialect.notify is not None

    def close(self) -> None:
        """Close the connection."""
        self.connection.close()

    def send(self, sql: str, args: Sequence[Any] = ()) -> Reply:
        """Send one statement (``?`` placeholders); read its answer when needed.

        In a transaction, statements whose answers are not read yet travel
        together (see `Connection.send`): an operation sends what it can
        before it reads.
        """
        if not self._native:
            sql = self.dialect.render(sql)
        return self.connection.send(sql, args)

    def send_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> Reply:
        """Send one ``UPDATE`` (``?`` placeholders) for each of ``rows`` of arguments.

        The `Reply` counts the rows changed by them all.
        """
        if not self._native:
            sql = self.dialect.render(sql)
        return self.connection.send_many(sql, rows)

    def execute(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement (``?`` placeholders); return its rows, if any."""
        return self.send(sql, args).rows()

    def update(self, sql: str, args: Sequence[Any]) -> int:
        """Run one ``UPDATE`` (``?`` placeholders); return how many rows it changed."""
        return self.send(sql, args).count()

    @contextmanager
    def transaction(self) -> Generator[None, None, None]:
        """Run the block in one transaction: committed if it ends, else rolled back."""
        self.connection.begin()
        try:
            yield
            # Inside: a COMMIT that fails may leave the transaction open
            # (SQLite keeps it after a deferred constraint or I/O error).
            self.connection.commit()
        except BaseException:
            self.connection.rollback()
            raise

    def now(self, now: float) -> float:
        """The time to record: the caller's clock unless the database keeps its own."""
        return self.send_now(now)()

    def send_now(self, now: float) -> Callable[[], float]:
        """`now`, asked for at once and read when the returned function is called."""
        if self.dialect.clock is None:
            return lambda: now
        # The database's clock judges leases for every machine.
        reply = self.send(self.dialect.clock)

        def read() -> float:
            [(seconds,)] = reply.rows()
            return float(seconds)

        return read

    def notify(self, news: str) -> None:
        """Tell listening workers about a new job or a cancel request.

        Delivered when the transaction commits, and only then; without
        listeners, workers poll.
        """
        if self.dialect.notify is not None:
            self.execute(self.dialect.notify, (news,))

    def select(self, where: str, args: Sequence[Any]) -> list[JobRecord]:
        """The jobs matching ``where``, by id, locked as a claim locks them."""
        rows = self.execute(
            f"SELECT {COLUMNS} FROM jobs WHERE {where} "
            f"ORDER BY id{self.dialect.lock_rows}",
            args,
        )
        return [record(row) for row in rows]

    def get(self, job_id: str, *, lock: bool = False) -> JobRecord:
        """The job ``job_id``, locked for a change if ``lock``.

        Raises:
            JobNotFoundError: if there is no such job.
        """
        rows = self.execute(
            f"SELECT {COLUMNS} FROM jobs WHERE id = ?"
            + (self.dialect.lock_row if lock else ""),
            (job_id,),
        )
        if not rows:
            raise JobNotFoundError(f"no job with id {job_id!r}")
        return record(rows[0])

    def write(
        self,
        job: JobRecord,
        event: JobEvent,
        *,
        now: float,
        worker: str | None,
        reason: str,
        changes: Mapping[str, Any],
        unless_leased: bool = False,
    ) -> JobRecord:
        """Check ``event`` against the table, apply it and its audit row.

        The row changes only if it is still as ``job`` was read (its state
        and attempt) and, with ``unless_leased``, if no live lease holds it
        at ``now``: one conditional ``UPDATE``, so that a rescue judges the
        lease as it is when it writes, not as an earlier read saw it.

        Raises:
            IllegalJobTransitionError: if the table does not allow ``event``.
            LostJobError: if the row changed since it was read, or a live
                lease holds it; nothing is written.
        """
        target, columns = transition(job, event, now=now, changes=changes)
        assignments = ", ".join(f"{name} = ?" for name in columns)
        condition = "id = ? AND state = ? AND attempts = ?"
        args: tuple[Any, ...] = (job.id, job.state.value, job.attempts)
        if unless_leased:
            condition += (
                " AND NOT EXISTS (SELECT 1 FROM job_workers w "
                "WHERE w.id = jobs.worker AND w.expires_at > ?)"
            )
            args = (*args, now)
        changed = self.update(
            f"UPDATE jobs SET {assignments} WHERE {condition}",
            (*columns.values(), *args),
        )
        if changed != 1:
            raise LostJobError(
                f"job {job.id} changed before its {event.value} was written; "
                f"it is no longer {job.state.value} on attempt {job.attempts}"
                + (" of a worker without a lease" if unless_leased else "")
            )
        self.send(  # the answer is not needed: it goes with the next statement
            "INSERT INTO job_events (job, source, target, at, worker, reason) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (job.id, job.state.value, target.value, now, worker, reason),
        )
        return updated(job, columns, at=now)


def transition(
    job: JobRecord, event: JobEvent, *, now: float, changes: Mapping[str, Any]
) -> tuple[JobState, dict[str, Any]]:
    """Check ``event`` against the table; return its target and the columns it sets.

    Raises:
        IllegalJobTransitionError: if the table does not allow ``event``.
    """
    target = JOB_TABLE.move(job.state, event, subject=f"job {job.id}")
    given = {"state": target.value, **changes}
    if target.terminal:
        given["ended_at"] = now
    unknown = given.keys() - set(WRITABLE)
    if unknown:  # a bug of this package: JobStore checks what callers give
        raise ValueError(f"jobs has no writable column {sorted(unknown)}")
    # The statement names the schema's columns, never the keys given.
    columns: dict[str, Any] = {n: given[n] for n in WRITABLE if n in given}
    return target, columns
