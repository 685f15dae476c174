"""Opening a job store from its URL: which database, and its options."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Final, cast

from ._postgres import PostgresConnection
from ._sql import Database
from ._sqlite import SQLiteConnection
from ._store import JobStore

DEFAULT_STORE_URL: Final = "sqlite:///jobs.db"


def _sqlite_options(query: str) -> dict[str, float]:
    if not query:
        return {}
    name, _, text = query.partition("=")
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if name != "busy_timeout" or not (seconds >= 0 and math.isfinite(seconds)):
        raise ValueError(
            "the only option of a SQLite store URL is busy_timeout=SECONDS "
            f"(a finite number >= 0), not {query!r}"
        )
    return {"busy_timeout": seconds}


def open_store(
    url: str = DEFAULT_STORE_URL,
    *,
    clock: Callable[[], float] = time.time,
    offload: bool = True,
) -> JobStore:
    """Open the job store at ``url``, creating its tables if needed. Not a checkpoint.

    Args:
        url (str): ``sqlite:///path/to/file.db`` (a relative path after the
            three slashes, an absolute one after four; ``?busy_timeout=S``
            sets how long a statement waits for another process's lock
            before the worker counts an outage, 30 s by default), or a PostgreSQL
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
        path, _, query = url[len(prefix) :].partition("?")
        connection = SQLiteConnection(path, **_sqlite_options(query))
        return JobStore(Database(connection), clock, offload)
    if url.startswith(("postgresql://", "postgres://")):
        return JobStore(Database(PostgresConnection(url)), clock, offload)
    raise ValueError(
        "store URL must look like sqlite:///path/to/file.db or "
        f"postgresql://host/database, not {url!r}"
    )
