"""The PostgreSQL connection of the job store: workers on several machines.

psycopg 3's synchronous API, called from worker threads (its async API
needs asyncio). Claims and rescues pick their rows with ``FOR UPDATE SKIP
LOCKED``, so concurrent workers never wait for each other's rows and never
take the same one. Every time written (leases above all) is the database's
``clock_timestamp()``, so the machines' clocks need not agree. Submissions
and cancel requests are announced with ``NOTIFY``; a worker listens on a
second connection and wakes at once instead of waiting for its next poll.

Connections are made with a connect timeout and TCP keep-alives (unless
the URL sets its own), so that a server that does not answer, or a peer
that vanished without closing the connection, raises
`psycopg.OperationalError` in bounded time instead of hanging. A
connection that broke is replaced at the next transaction; the errors are
outages that the worker retries (`_outages`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final

import attrs

from ._exceptions import StoreError
from ._outages import is_postgres_outage
from ._sql import Answered, Database, Dialect, Reply

if TYPE_CHECKING:
    import psycopg

CHANNEL = "trio_graceful_jobs"

POSTGRESQL: Final = Dialect(
    placeholder="%s",
    order_column="id",
    lock_row=" FOR UPDATE",
    lock_rows=" FOR UPDATE SKIP LOCKED",
    real="DOUBLE PRECISION",
    serial="BIGSERIAL PRIMARY KEY",
    clock="SELECT extract(epoch FROM clock_timestamp())",
    notify=f"SELECT pg_notify('{CHANNEL}', ?)",
)
# Any constant: serializes the creation of the tables by several workers.
_SCHEMA_LOCK = 7_140_221
# libpq's parameters, unless the URL sets them: give up on a server that does
# not answer a connection attempt after 5 s, and find a dead peer within
# about 10 + 3 * 5 s of silence (rather than the kernel's two hours).
_CONNECT_DEFAULTS = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
}


@attrs.frozen
class _Pending:
    """The `Reply` to a statement in a transaction's pipeline, not yet read."""

    _connection: PostgresConnection
    _cursor: psycopg.Cursor[Any]
    _number: int
    """Its place in the pipeline."""

    def rows(self) -> list[tuple[Any, ...]]:
        self._connection.wait_for(self._number)
        return self._cursor.fetchall() if self._cursor.description else []

    def count(self) -> int:
        self._connection.wait_for(self._number)
        return self._cursor.rowcount


def _redact(url: str) -> str:
    return re.sub(r"://([^:/@]*):[^@/]*@", r"://\1:***@", url)


class PostgresConnection:
    """One connection to a PostgreSQL store (`Connection`), and one to listen on."""

    dialect: ClassVar[Dialect] = POSTGRESQL

    def __init__(self, url: str, *, first: bool = True) -> None:
        try:
            import psycopg
        except ImportError:
            raise StoreError(
                "the PostgreSQL store needs psycopg 3: "
                "pip install 'trio_graceful[postgres]'"
            ) from None
        from psycopg.conninfo import conninfo_to_dict

        given = conninfo_to_dict(url)
        self._url = url
        self._options = {k: v for k, v in _CONNECT_DEFAULTS.items() if k not in given}
        self._listener: psycopg.Connection[Any] | None = None
        # A transaction's statements go in one pipeline: sent together,
        # until the answer of one is needed (`_Pending`).
        self._transaction = contextlib.ExitStack()
        self._pipeline: psycopg.Pipeline | None = None
        self._sent = self._answered = 0
        if not first:
            # A second connection of a store: its errors are outages.
            self._db: psycopg.Connection[Any] = self._connect()
            return
        try:
            self._db = self._connect()
        except psycopg.Error as exc:
            # libpq's message spans lines (a hint on the next, indented).
            why = " ".join(str(exc).split())
            raise StoreError(
                f"cannot connect to the PostgreSQL store {_redact(url)!r}: {why}"
            ) from None
        # The tables are created once, by whichever worker comes first.
        db = Database(self)
        with db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(?)", (_SCHEMA_LOCK,))
            for statement in POSTGRESQL.schema().split(";"):
                if statement.strip():
                    db.execute(statement)

    def another(self) -> PostgresConnection:
        """A second connection to the store's server, without a listener."""
        return PostgresConnection(self._url, first=False)

    def send(self, sql: str, args: Sequence[Any] = ()) -> Reply:
        cursor = self._db.cursor()
        cursor.execute(sql, args)  # pyright: ignore[reportArgumentType]
        return self._reply(cursor)

    def send_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> Reply:
        # Outside a transaction's pipeline, psycopg sends them in one of its
        # own: one round trip either way, not one a row.
        cursor = self._db.cursor()
        cursor.executemany(sql, rows)  # pyright: ignore[reportArgumentType]
        return self._reply(cursor)

    def _reply(self, cursor: psycopg.Cursor[Any]) -> Reply:
        if self._pipeline is None:
            rows = cursor.fetchall() if cursor.description else []
            return Answered(rows, cursor.rowcount)
        self._sent += 1
        return _Pending(self, cursor, self._sent)

    def wait_for(self, number: int) -> None:
        """Until the answer of the ``number``-th statement of the pipeline came."""
        if number > self._answered:
            assert self._pipeline is not None
            self._answered = self._sent
            self._pipeline.sync()

    def _connect(self) -> psycopg.Connection[Any]:
        import psycopg
        from psycopg.conninfo import make_conninfo

        return psycopg.connect(
            make_conninfo(self._url, **self._options), autocommit=True
        )

    def begin(self) -> None:
        import psycopg

        if self._db.closed:
            self._db = self._connect()
        try:
            if psycopg.Pipeline.is_supported():  # libpq 14 and later
                self._pipeline = self._transaction.enter_context(self._db.pipeline())
                self._sent = self._answered = 0
            self.send("BEGIN")
        except BaseException:
            self.rollback()  # the pipeline ends with the transaction
            raise

    def commit(self) -> None:
        self.send("COMMIT")
        self._end_pipeline()  # sends what is left, and raises its errors

    def rollback(self) -> None:
        import psycopg

        # The statement's error, or the lost connection's, is on its way.
        with contextlib.suppress(psycopg.Error):
            self._end_pipeline()
        # A broken connection (the server went away) has nothing to roll
        # back; it is replaced at the next transaction.
        if not self._db.closed:
            self.send("ROLLBACK")

    def _end_pipeline(self) -> None:
        self._pipeline = None
        self._transaction.close()

    def check(self) -> None:
        """Nothing to check: a server that went away is an outage."""

    def is_outage(self, exc: BaseException) -> bool:
        return is_postgres_outage(exc)

    def wait_for_news(self, timeout: float) -> list[str]:
        import psycopg

        if self._listener is None or self._listener.closed:
            self._listener = self._connect()
            self._listener.execute(f"LISTEN {CHANNEL}")
        try:
            return [
                news.payload
                for news in self._listener.notifies(timeout=timeout, stop_after=1)
            ]
        except psycopg.Error:
            # A new connection listens again at the next wait.
            self._listener.close()
            raise

    def close(self) -> None:
        self._db.close()
        if self._listener is not None:
            self._listener.close()
