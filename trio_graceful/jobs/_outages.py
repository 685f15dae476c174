"""Which store errors are outages (retried) and which are bugs (raised).

An outage is the store being away for a while: a lost connection, a
database restarting or locked by another process past the busy timeout, a
disk that refuses writes. The operation was not applied (or, if its commit
was lost on the way back, applying it again is harmless: see
`_holding.finish`), so the worker retries it once the store is back.
Everything else (a wrong query, a constraint violated, a value the database
cannot hold) is a bug in the program: retrying it would fail the same way
forever, so it is raised at once.
"""

from __future__ import annotations

import sqlite3
from typing import Final

# SQLite's primary result codes (https://sqlite.org/rescode.html) that mean
# "not now" rather than "never": the file is busy, locked, unwritable or
# full, or its locks cannot be taken.
_SQLITE_OUTAGE_CODES: Final = {
    5: "SQLITE_BUSY",
    6: "SQLITE_LOCKED",
    7: "SQLITE_NOMEM",
    8: "SQLITE_READONLY",
    10: "SQLITE_IOERR",
    13: "SQLITE_FULL",
    14: "SQLITE_CANTOPEN",
    15: "SQLITE_PROTOCOL",
}
# Python 3.10 has no sqlite_errorcode: the messages SQLite gives those codes.
_SQLITE_OUTAGE_MESSAGES: Final = (
    "database is locked",
    "database table is locked",
    "out of memory",
    "attempt to write a readonly database",
    "disk I/O error",
    "database or disk is full",
    "unable to open database file",
    "locking protocol",
)


def is_sqlite_outage(exc: BaseException) -> bool:
    """True for a SQLite error that should go away by itself."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code: int | None = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _SQLITE_OUTAGE_CODES
    return str(exc).startswith(_SQLITE_OUTAGE_MESSAGES)


def is_postgres_outage(exc: BaseException) -> bool:
    """True for a psycopg error that should go away by itself.

    psycopg raises `psycopg.OperationalError` for what is outside the
    program's control: the connection lost or refused (SQLSTATE class 08),
    the server shutting down or starting (57P01-57P03), a query cancelled by
    the administrator (57014), a serialization failure or deadlock (class
    40), no resources left (class 53), a system or I/O error (class 58).
    A read-only transaction (25006, an `psycopg.InternalError`) is a standby
    not yet promoted after a failover. Everything else is a bug.
    """
    import psycopg

    if isinstance(exc, psycopg.OperationalError):
        return True
    return isinstance(exc, psycopg.Error) and exc.sqlstate == "25006"
