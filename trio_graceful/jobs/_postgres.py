"""The PostgreSQL dialect of the job store: workers on several machines.

psycopg 3's synchronous API, called from worker threads (its async API
needs asyncio). Claims and rescues pick their rows with ``FOR UPDATE SKIP
LOCKED``, so concurrent workers never wait for each other's rows and never
take the same one. Every time written (leases above all) is the database's
``clock_timestamp()``, so the machines' clocks need not agree. Submissions
and cancel requests are announced with ``NOTIFY``; a worker listens on a
second connection and wakes at once instead of waiting for its next poll.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._schema import SCHEMA
from ._sql import SqlQueries, StoreError

if TYPE_CHECKING:
    import psycopg

CHANNEL = "trio_graceful_jobs"
# Any constant: serializes the creation of the tables by several workers.
_SCHEMA_LOCK = 7_140_221


def _redact(url: str) -> str:
    return re.sub(r"://([^:/@]*):[^@/]*@", r"://\1:***@", url)


class PostgresQueries(SqlQueries):
    """The store's operations on one PostgreSQL connection (and one to listen on)."""

    lock_rows = " FOR UPDATE SKIP LOCKED"
    lock_row = " FOR UPDATE"
    listens = True

    def __init__(self, url: str) -> None:
        try:
            import psycopg
        except ImportError:
            raise StoreError(
                "the PostgreSQL store needs psycopg 3: "
                "pip install 'trio_graceful[postgres]'"
            ) from None
        self._url = url
        self._listener: psycopg.Connection[Any] | None = None
        try:
            self._db: psycopg.Connection[Any] = psycopg.connect(url, autocommit=True)
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot connect to the PostgreSQL store {_redact(url)!r}: {exc}"
            ) from None
        schema = SCHEMA.format(real="DOUBLE PRECISION", serial="BIGSERIAL PRIMARY KEY")
        with self._transaction():
            self._execute("SELECT pg_advisory_xact_lock(?)", (_SCHEMA_LOCK,))
            for statement in schema.split(";"):
                if statement.strip():
                    self._execute(statement)

    def _execute(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._db.cursor() as cursor:
            # Built from this package's constants only, never from input.
            query = sql.replace("?", "%s")
            cursor.execute(query, args)  # pyright: ignore[reportArgumentType]
            return cursor.fetchall() if cursor.description else []

    def _begin(self) -> None:
        self._execute("BEGIN")

    def _now(self, now: float) -> float:
        del now  # the database's clock judges leases for every machine
        [(seconds,)] = self._execute("SELECT extract(epoch FROM clock_timestamp())")
        return float(seconds)

    def _notify(self, news: str) -> None:
        # Delivered when the transaction commits, and only then.
        self._execute("SELECT pg_notify(?, ?)", (CHANNEL, news))

    def wait_for_news(self, timeout: float) -> None:
        import psycopg

        if self._listener is None:
            self._listener = psycopg.connect(self._url, autocommit=True)
            self._listener.execute(f"LISTEN {CHANNEL}")
        for _ in self._listener.notifies(timeout=timeout, stop_after=1):
            pass

    def close(self) -> None:
        self._db.close()
        if self._listener is not None:
            self._listener.close()
