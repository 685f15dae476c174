"""The SQLite dialect of the job store: one file, shared by the processes of a host.

``BEGIN IMMEDIATE`` takes the database's write lock at the start of every
transaction, so two processes never claim one job. WAL mode lets readers
(status queries) go on while a worker writes, and ``synchronous=FULL``
makes a committed transition survive a power cut.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from ._sql import SCHEMA, SqlQueries, StoreError


class SQLiteQueries(SqlQueries):
    """The store's operations on one SQLite connection."""

    order_column = "rowid"

    def __init__(self, path: str) -> None:
        try:
            # isolation_level=None: transactions are begun explicitly.
            self._db = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=30
            )
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"store file {path!r} cannot be opened: {exc}") from None
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(
                SCHEMA.format(real="REAL", serial="INTEGER PRIMARY KEY AUTOINCREMENT")
            )
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StoreError(
                f"store file {path!r} is not a usable SQLite database: {exc}"
            ) from None

    def _execute(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._db.execute(sql, args).fetchall()

    def _begin(self) -> None:
        self._execute("BEGIN IMMEDIATE")

    def close(self) -> None:
        self._db.close()
