"""The SQLite connection of the job store: one file, shared by the processes of a host.

``BEGIN IMMEDIATE`` takes the database's write lock at the start of every
transaction, so two processes never claim one job. WAL mode lets readers
(status queries) go on while a worker writes, and ``synchronous=FULL``
makes a committed transition survive a power cut.

A statement waits ``busy_timeout`` seconds (30 by default) for another
process's lock, then fails with "database is locked": an outage that the
worker retries (`_outages`), so a worker outlasts any lock. The store waits
for the lock itself, trying again after 50 µs, then twice as long each time
up to 2 ms: SQLite's own busy handler sleeps 1, 2, 5 ... up to 100 ms between
tries, so that with several workers on one file the lock would sit free
while they sleep, and one worker could keep it while the others wait. The file's
device and inode are noted at the opening: if the file is deleted or
replaced, the next transaction (and `check`) raises `StoreGoneError`
instead of writing into a file that nobody will read again.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Final, NoReturn

from ._exceptions import StoreError, StoreGoneError
from ._outages import is_sqlite_outage
from ._sql import Answered, Dialect

# How long opening a store waits for other processes to let go of the file.
_OPEN_TIMEOUT: Final = 30.0
# Seconds between two tries of a statement that found the file locked.
_FIRST_WAIT: Final = 0.00005
_LONGEST_WAIT: Final = 0.002
_SQLITE_BUSY: Final = 5

SQLITE: Final = Dialect(
    placeholder="?",
    # Ties in time go by submission: the rowid grows, a random id does not.
    order_column="rowid",
    # BEGIN IMMEDIATE holds the whole file: rows need no locks of their own.
    lock_row="",
    lock_rows="",
    real="REAL",
    serial="INTEGER PRIMARY KEY AUTOINCREMENT",
)


def _retry_while_locked(set_up: Callable[[], object]) -> None:
    """Run ``set_up`` again while another process holds the file's lock.

    Changing the journal mode does not wait for a lock as statements do
    (SQLite calls no busy handler there): two processes opening a new store
    at once, or one opening it while another writes, would fail at once.
    """
    deadline = time.monotonic() + _OPEN_TIMEOUT
    while True:
        try:
            set_up()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
        else:
            return


class SQLiteConnection:
    """One connection to a SQLite store (`Connection`)."""

    dialect: ClassVar[Dialect] = SQLITE

    def __init__(self, path: str, *, busy_timeout: float = 30.0) -> None:
        self._path = path
        self._busy_timeout = busy_timeout
        self._identity: tuple[int, int] | None = None
        try:
            # isolation_level=None: transactions are begun explicitly.
            # timeout=0: SQLite's busy handler is replaced by _wait_for_lock.
            self._db = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=0
            )
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"store file {path!r} cannot be opened: {exc}") from None
        try:
            _retry_while_locked(self._set_up)
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StoreError(
                f"store file {path!r} is not a usable SQLite database: {exc}"
            ) from None
        if path != ":memory:" and not path.startswith("file:"):
            self._identity = _identity(path)

    def _set_up(self) -> None:
        # Only the first opening of a file changes its journal mode.
        (mode,) = self._db.execute("PRAGMA journal_mode").fetchone()
        if mode != "wal":
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SQLITE.schema())

    def send(self, sql: str, args: Sequence[Any] = ()) -> Answered:
        # In process: nothing to gain from sending statements together.
        cursor = self._cursor(sql, args)
        return Answered(cursor.fetchall(), cursor.rowcount)

    def send_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> Answered:
        # Only inside a transaction, whose BEGIN IMMEDIATE took the lock.
        return Answered([], self._db.executemany(sql, rows).rowcount)

    def _cursor(self, sql: str, args: Sequence[Any]) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, args)
        except sqlite3.OperationalError as exc:
            if not self._may_wait(exc) or not self._busy_timeout:
                raise
        return self._wait_for_lock(sql, args)

    def _may_wait(self, exc: sqlite3.OperationalError) -> bool:
        # Inside a transaction SQLite asks for a rollback rather than a retry;
        # in WAL mode, with the lock taken by BEGIN IMMEDIATE, it never comes.
        return _is_busy(exc) and not self._db.in_transaction

    def _wait_for_lock(self, sql: str, args: Sequence[Any]) -> sqlite3.Cursor:
        """Try ``sql`` until the file is free; at the deadline, raise its error."""
        deadline = time.monotonic() + self._busy_timeout
        wait = _FIRST_WAIT
        while True:
            # Jitter, so that the workers of a host do not try in step.
            left = max(0.0, deadline - time.monotonic())
            time.sleep(min(left, wait * random.uniform(0.5, 1.5)))
            try:
                return self._db.execute(sql, args)
            except sqlite3.OperationalError as exc:
                if not self._may_wait(exc) or time.monotonic() >= deadline:
                    raise
            wait = min(2 * wait, _LONGEST_WAIT)

    def another(self) -> None:
        """None: a SQLite file has one writer at a time; a second would wait."""
        return None

    def begin(self) -> None:
        self.check()
        self.send("BEGIN IMMEDIATE")

    def commit(self) -> None:
        self.send("COMMIT")

    def rollback(self) -> None:
        # A failed BEGIN, or a COMMIT that ended the transaction anyway,
        # leaves nothing to roll back.
        if self._db.in_transaction:
            self.send("ROLLBACK")

    def is_outage(self, exc: BaseException) -> bool:
        return is_sqlite_outage(exc)

    def check(self) -> None:
        if self._identity is None:
            return
        now: tuple[int, int] | OSError
        try:
            now = _identity(self._path)
        except OSError as exc:
            now = exc
        if now != self._identity:
            raise StoreGoneError(
                f"store file {self._path!r} was deleted or replaced "
                f"under the worker ({_describe(now)})"
            )

    def wait_for_news(self, timeout: float) -> NoReturn:
        raise NotImplementedError("this store does not listen; poll instead")

    def close(self) -> None:
        self._db.close()


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    code: int | None = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF == _SQLITE_BUSY
    return str(exc).startswith("database is locked")  # Python 3.10


def _identity(path: str) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino


def _describe(now: tuple[int, int] | OSError) -> str:
    if isinstance(now, OSError):
        return now.strerror or type(now).__name__
    return "another file is at its path now"
