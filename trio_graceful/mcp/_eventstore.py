"""An MCP event store that several server processes share: SQLite or PostgreSQL.

A Streamable HTTP server with an `mcp.server.streamable_http.EventStore`
stores each message it sends on an event stream, and answers a client that
reconnects with ``Last-Event-ID`` by replaying the events of that stream
after that id. With an in-process store only the process that stored the
events can replay them; `SharedEventStore` keeps them in one database, so
that a client whose stream was closed by one replica can resume it on
another (see the how-to "MCP servers", "Resuming event streams across
replicas", for what resumes there and what cannot).

The database orders the events: each row gets the next value of the table's
own sequence (``AUTOINCREMENT`` in SQLite, an identity column in
PostgreSQL), so ids compare the same way in every process. An event id is
that number and 64 random bits, ``"<number>-<16 hex digits>"``: a replay
needs both, so that nobody replays a stream by counting. The SDK awaits
each `SharedEventStore.store_event` before the next message of the stream,
so one stream's rows commit in the order of their numbers.

Every statement runs in a worker thread (the drivers block), one at a time
on the store's one connection. The store's own `trio.CapacityLimiter` of one
thread lets them through, so that a busy store never takes the threads of
the server's tools; a cancelled call leaves its thread behind at once (a
second Ctrl+C does not wait for a database that does not answer), which
keeps the limiter's token until its statement ends. Closing waits for that
statement on a `threading.Lock`, in a thread of its own if need be. Each
statement commits by itself (autocommit): none needs a transaction of its
own.

An outage (the database unreachable, locked past ``timeout`` or read-only)
does not stop the server's messages: `SharedEventStore.store_event` logs a
warning, counts the event in `EventStoreStatistics.not_stored` and returns
an id that no row has, so the message still goes out live and only its
replay is lost. The SDK would otherwise end the session's message router at
the first error (no more answers for that session) or answer the request
with HTTP 500. A PostgreSQL connection that broke is replaced at the next
call.
"""

from __future__ import annotations

import math
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar, final

import attrs
import trio
from mcp.server.streamable_http import (
    EventCallback,
    EventId,
    EventMessage,
    EventStore,
    StreamId,
)
from mcp_types import JSONRPCMessage, jsonrpc_message_adapter

from .._core._checks import check_count, check_seconds, check_string
from .._core._log import library_logger

if TYPE_CHECKING:
    import psycopg

logger = library_logger("trio_graceful.mcp")

_T = TypeVar("_T")

_EVENT_ID: Final = re.compile(r"([1-9][0-9]{0,18})-([0-9a-f]{16})")
# Table and index names say whose they are: the jobs may share the database.
_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS mcp_events (
    seq {serial},
    token TEXT NOT NULL,
    stream TEXT NOT NULL,
    message TEXT,
    stored_at {real} NOT NULL
);
CREATE INDEX IF NOT EXISTS mcp_events_by_stream ON mcp_events (stream, seq);
CREATE INDEX IF NOT EXISTS mcp_events_by_age ON mcp_events (stored_at)
"""
# Any constant: serializes the creation of the table by several replicas.
_SCHEMA_LOCK: Final = 7_140_333


class _Connection(Protocol):
    """One database connection, as the store uses it: calls must not overlap."""

    def rows(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Run a statement written with ``?``; return the rows it returns."""
        ...

    def count(self, sql: str, args: Sequence[Any]) -> int:
        """Run a statement written with ``?``; return how many rows it changed."""
        ...

    def is_outage(self, exc: BaseException) -> bool:
        """True if ``exc`` means the database is away for now, not a bug."""
        ...

    def close(self) -> None:
        """Close the connection."""
        ...


class _SQLiteConnection:
    """A SQLite file in WAL mode: readers never wait for the writer."""

    def __init__(self, path: str, *, timeout: float) -> None:
        # timeout: SQLite's own busy handler waits that long for a lock.
        self._db = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, timeout=timeout
        )
        try:
            # With a busy timeout, even the change of journal mode waits for
            # another process that opens or reads the new file at that moment.
            (mode,) = self._db.execute("PRAGMA journal_mode").fetchone()
            if mode != "wal":
                self._db.execute("PRAGMA journal_mode=WAL")
            # A commit is not synced to the disk, only the checkpoints: a
            # power cut may lose the last events (never corrupt the file),
            # and each event costs no fsync.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(
                _SCHEMA.format(serial="INTEGER PRIMARY KEY AUTOINCREMENT", real="REAL")
            )
        except BaseException:
            self._db.close()
            raise

    def rows(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        return self._db.execute(sql, args).fetchall()

    def count(self, sql: str, args: Sequence[Any]) -> int:
        return self._db.execute(sql, args).rowcount

    def is_outage(self, exc: BaseException) -> bool:
        # Locked, read-only, full, unopenable: OperationalError; a wrong
        # statement is too, but the store's statements are constants.
        return isinstance(exc, sqlite3.OperationalError)

    def close(self) -> None:
        self._db.close()


class _PostgresConnection:
    """A PostgreSQL database (psycopg 3's synchronous API), reconnected when broken."""

    def __init__(self, url: str, *, timeout: float) -> None:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        # libpq's own options, unless the URL sets them: give up on a server
        # that does not answer, and notice a peer that vanished.
        given = conninfo_to_dict(url)
        defaults = {
            "connect_timeout": str(max(1, math.ceil(timeout))),
            "keepalives": "1",
            "keepalives_idle": "10",
            "keepalives_interval": "5",
            "keepalives_count": "3",
        }
        self._conninfo = make_conninfo(
            url, **{k: v for k, v in defaults.items() if k not in given}
        )
        self._db = self._connect()
        with self._db.transaction():
            self._db.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            script = _SCHEMA.format(
                serial="BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
                real="DOUBLE PRECISION",
            )
            for statement in script.split(";"):
                self._db.execute(statement.encode())

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        import psycopg

        return psycopg.connect(self._conninfo, autocommit=True)

    def _cursor(self, sql: str, args: Sequence[Any]) -> psycopg.Cursor[tuple[Any, ...]]:
        if self._db.closed:  # broken at an earlier call: the server went away
            self._db = self._connect()
        # The statements are this module's constants: no ``?`` but placeholders.
        query = sql.replace("?", "%s").encode()
        return self._db.execute(query, args)

    def rows(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        return self._cursor(sql, args).fetchall()

    def count(self, sql: str, args: Sequence[Any]) -> int:
        return self._cursor(sql, args).rowcount

    def is_outage(self, exc: BaseException) -> bool:
        import psycopg

        # Refused, lost, shutting down, out of resources; or a standby
        # that a failover has not yet promoted (read-only transaction).
        return isinstance(exc, psycopg.OperationalError) or (
            isinstance(exc, psycopg.Error) and exc.sqlstate == "25006"
        )

    def close(self) -> None:
        self._db.close()


@attrs.frozen
class EventStoreStatistics:
    """What a `SharedEventStore` did since it was opened."""

    stored: int
    """Events written to the database (priming events included)."""
    not_stored: int
    """Events not stored because the database was away; each was sent if its
    stream was open, and is never replayed."""
    replayed: int
    """Events sent again to clients that resumed a stream."""
    purged: int
    """Events this store deleted for being older than ``max_age`` or beyond
    ``max_events``."""


@final
@attrs.define(eq=False)
class SharedEventStore(EventStore):
    """An `~mcp.server.streamable_http.EventStore` in a database that replicas share.

    Made by `open_event_store`; give it to
    `streamable_http_app(event_store=...) <streamable_http_app>`, which
    keeps each session's streams apart in it (the SDK's own
    ``streamable_http_app`` would not: a replay would send other sessions'
    events of the same stream name). The SDK calls its two methods;
    `purge` runs by itself every ``purge_interval`` seconds.
    """

    _connection: _Connection
    _clock: Callable[[], float]
    _max_age: float
    _max_events: int | None
    # See the module docstring: one thread at a time, and the closing waits.
    _limiter: trio.CapacityLimiter = attrs.field(
        factory=lambda: trio.CapacityLimiter(1), init=False
    )
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _stored: int = attrs.field(default=0, init=False)
    _not_stored: int = attrs.field(default=0, init=False)
    _replayed: int = attrs.field(default=0, init=False)
    _purged: int = attrs.field(default=0, init=False)

    def _run_locked(self, fn: Callable[[], _T]) -> Callable[[], _T]:
        def locked() -> _T:
            with self._lock:
                return fn()

        return locked

    async def _run(self, fn: Callable[[], _T]) -> _T:
        return await trio.to_thread.run_sync(
            self._run_locked(fn), abandon_on_cancel=True, limiter=self._limiter
        )

    async def store_event(
        self, stream_id: StreamId, message: JSONRPCMessage | None
    ) -> EventId:
        """Store ``message`` (`None` to prime) as the next event of ``stream_id``.

        During an outage the event is logged and counted, not stored, and the
        id returned is one that no row has: a resumption from it replays
        nothing. This is a checkpoint.

        Returns:
            The new event's id.
        """
        token = secrets.token_hex(8)
        text = (
            None
            if message is None
            else jsonrpc_message_adapter.dump_json(
                message, by_alias=True, exclude_unset=True
            ).decode()
        )

        def insert() -> int:
            [(seq,)] = self._connection.rows(
                "INSERT INTO mcp_events (token, stream, message, stored_at) "
                "VALUES (?, ?, ?, ?) RETURNING seq",
                (token, stream_id, text, self._clock()),
            )
            return int(seq)

        try:
            seq = await self._run(insert)
        except Exception as exc:
            if not self._connection.is_outage(exc):
                raise
            self._not_stored += 1
            logger.warning(
                "event of stream %r not stored, so it cannot be replayed: %s",
                stream_id,
                " ".join(str(exc).split()),
            )
            return f"0-{token}"  # no row has the number 0
        self._stored += 1
        return f"{seq}-{token}"

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        """Send the events of ``last_event_id``'s stream stored after it, in order.

        Priming events are not sent. An id that no stored event has (never
        stored, purged, or not an id of this store) replays nothing. This is a
        checkpoint.

        Returns:
            The stream of ``last_event_id``, or `None` if no stored event has
            that id, as the SDK expects.

        Raises:
            Exception: the driver's error if the database cannot be read
                (the SDK logs it and ends the resumed stream).
        """
        found = _EVENT_ID.fullmatch(last_event_id)
        if found is None:
            return None
        seq, token = int(found[1]), found[2]

        def select() -> tuple[str, list[tuple[Any, ...]]] | None:
            streams = self._connection.rows(
                "SELECT stream FROM mcp_events WHERE seq = ? AND token = ?",
                (seq, token),
            )
            if not streams:
                return None
            [(stream,)] = streams
            return stream, self._connection.rows(
                "SELECT seq, token, message FROM mcp_events "
                "WHERE stream = ? AND seq > ? AND message IS NOT NULL ORDER BY seq",
                (stream, seq),
            )

        replay = await self._run(select)
        if replay is None:
            return None
        stream, events = replay
        for number, event_token, text in events:
            message = jsonrpc_message_adapter.validate_json(text)
            await send_callback(EventMessage(message, f"{number}-{event_token}"))
            self._replayed += 1
        return stream

    async def purge(self) -> int:
        """Delete the events older than ``max_age`` and those beyond ``max_events``.

        Runs in a worker thread. This is a checkpoint.

        Returns:
            How many events were deleted.
        """
        oldest = self._clock() - self._max_age
        max_events = self._max_events

        def delete() -> int:
            deleted = self._connection.count(
                "DELETE FROM mcp_events WHERE stored_at < ?", (oldest,)
            )
            if max_events is not None:
                deleted += self._connection.count(
                    "DELETE FROM mcp_events WHERE seq <= "
                    "(SELECT MAX(seq) FROM mcp_events) - ?",
                    (max_events,),
                )
            return deleted

        deleted = await self._run(delete)
        self._purged += deleted
        return deleted

    async def _purge_every(self, interval: float) -> None:
        while True:
            await trio.sleep(interval)
            try:
                await self.purge()
            except Exception as exc:
                if not self._connection.is_outage(exc):
                    raise
                logger.warning(
                    "events not purged (the next try is in %g s): %s",
                    interval,
                    " ".join(str(exc).split()),
                )

    def _close(self) -> None:
        """Close the connection once no statement runs; never wait for one."""
        if self._lock.acquire(blocking=False):
            try:
                self._connection.close()
            finally:
                self._lock.release()
            return
        # A cancelled call left its statement running (the database is away):
        # its thread closes the connection after it.
        threading.Thread(
            target=self._run_locked(self._connection.close),
            name="closing the MCP event store",
            daemon=True,
        ).start()

    def statistics(self) -> EventStoreStatistics:
        """What the store did since it was opened. Not a checkpoint."""
        return EventStoreStatistics(
            stored=self._stored,
            not_stored=self._not_stored,
            replayed=self._replayed,
            purged=self._purged,
        )


def _positive_seconds(argument: str, value: object) -> float:
    seconds = check_seconds(argument, value)
    if seconds == 0 or seconds == math.inf:
        raise ValueError(f"{argument} must be > 0 and finite, not {value!r}")
    return seconds


def _connect(url: str, timeout: float) -> _Connection:
    prefix = "sqlite:///"
    if url.startswith(prefix) and len(url) > len(prefix) and "?" not in url:
        return _SQLiteConnection(url[len(prefix) :], timeout=timeout)
    if url.startswith(("postgresql://", "postgres://")):
        try:
            import psycopg  # noqa: F401  # pyright: ignore[reportUnusedImport]
        except ImportError:
            raise ImportError(
                "the PostgreSQL event store needs psycopg 3: "
                "pip install 'trio_graceful[postgres]'"
            ) from None
        return _PostgresConnection(url, timeout=timeout)
    raise ValueError(
        "url must look like sqlite:///path/to/events.db or "
        f"postgresql://host/database, not {url!r}"
    )


@asynccontextmanager
async def open_event_store(
    url: str,
    *,
    max_age: float = 3600.0,
    max_events: int | None = 100_000,
    purge_interval: float = 60.0,
    timeout: float = 5.0,
    clock: Callable[[], float] = time.time,
) -> AsyncGenerator[SharedEventStore, None]:
    """Open the event store at ``url``, creating its table if needed.

    Several processes, on one host with SQLite or on several with
    PostgreSQL, may open the same store at once: what one stores, the others
    replay. While the block runs, a task deletes old events every
    ``purge_interval`` seconds (`SharedEventStore.purge`, in a worker
    thread); events stay at most about ``max_age + purge_interval`` seconds.
    Opening and closing are checkpoints.

    Args:
        url (str): ``sqlite:///path/to/events.db`` (a relative path after the
            three slashes, an absolute one after four), or a PostgreSQL URL
            ``postgresql://user@host/database`` (needs the ``postgres``
            extra). A database a job store uses may hold the events too.
        max_age (float): Seconds an event is kept: long enough for a client
            to reconnect after its stream was closed (the ``retry`` hint, a
            load balancer's failover), short enough to bound the table.
        max_events (int | None): How many of the newest events are kept, in
            all streams together (at most: numbers a failed insert took are
            counted too); `None` for no bound but ``max_age``.
        purge_interval (float): Seconds between two purges.
        timeout (float): Seconds a statement waits for another process's
            lock on a SQLite file, or for a PostgreSQL server to accept a
            connection, before the database counts as away.
        clock: The time events are stamped and judged with (seconds since the
            epoch); every replica's clock should agree to well within ``max_age``.

    Raises:
        TypeError: if an argument has the wrong type.
        ValueError: if ``url`` is not an event store URL, or a number is out
            of range (zero, negative, not finite).
        ImportError: for a PostgreSQL URL without psycopg installed.
        Exception: the driver's error (``sqlite3.Error``, ``psycopg.Error``)
            if the database cannot be opened.
    """
    check_string("url", url)
    max_age = _positive_seconds("max_age", max_age)
    if max_events is not None:
        check_count("max_events", max_events)
    purge_interval = _positive_seconds("purge_interval", purge_interval)
    timeout = _positive_seconds("timeout", timeout)
    connection = await trio.to_thread.run_sync(_connect, url, timeout)
    store = SharedEventStore(connection, clock, max_age, max_events)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store._purge_every, purge_interval)  # pyright: ignore[reportPrivateUsage]
            yield store
            nursery.cancel_scope.cancel(reason="the event store is closing")
    finally:
        store._close()  # pyright: ignore[reportPrivateUsage]
