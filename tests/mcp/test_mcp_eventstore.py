"""The shared event store: the SDK's EventStore contract on SQLite and PostgreSQL,
two replicas on one database, retention, bad arguments and outages."""

from __future__ import annotations

import contextlib
import logging
import math
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from mcp.server.streamable_http import EventMessage
from mcp_types import (
    ErrorData,
    JSONRPCError,
    JSONRPCMessage,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
)

from trio_graceful.mcp import EventStoreStatistics, SharedEventStore, open_event_store

MESSAGES: list[JSONRPCMessage] = [
    JSONRPCNotification(jsonrpc="2.0", method="notifications/message", params={"n": 1}),
    JSONRPCRequest(jsonrpc="2.0", id=7, method="sampling/createMessage"),
    JSONRPCResponse(jsonrpc="2.0", id=3, result={"content": ["é", 2]}),
    JSONRPCError(jsonrpc="2.0", id=4, error=ErrorData(code=-32000, message="no")),
]


class Replay:
    """The callback of a replay, and what it was sent."""

    def __init__(self) -> None:
        self.sent: list[EventMessage] = []

    async def __call__(self, event: EventMessage) -> None:
        self.sent.append(event)


async def replay(store: SharedEventStore, last: str) -> tuple[str | None, list[Any]]:
    """The stream and the (id, message) pairs a replay after ``last`` sends."""
    callback = Replay()
    stream = await store.replay_events_after(last, callback)
    return stream, [(event.event_id, event.message) for event in callback.sent]


def number(event_id: str) -> int:
    return int(event_id.split("-")[0])


async def test_events_replay_after_an_id_in_their_stream_only(store_url: str) -> None:
    async with open_event_store(store_url) as store:
        prime = await store.store_event("_GET_stream", None)
        ids: list[str] = []
        for message in MESSAGES:
            ids.append(await store.store_event("_GET_stream", message))
            await store.store_event("3", message)  # another stream, interleaved
        assert [number(i) for i in [prime, *ids]] == sorted(
            number(i) for i in [prime, *ids]
        )
        assert len({prime, *ids}) == 5
        # After the priming event: every message, priming events never.
        assert await replay(store, prime) == (
            "_GET_stream",
            list(zip(ids, MESSAGES, strict=True)),
        )
        assert await replay(store, ids[1]) == (
            "_GET_stream",
            list(zip(ids[2:], MESSAGES[2:], strict=True)),
        )
        assert await replay(store, ids[-1]) == ("_GET_stream", [])
        assert store.statistics() == EventStoreStatistics(
            stored=9, not_stored=0, replayed=6, purged=0
        )


@pytest.mark.parametrize(
    "last",
    ["", "nonsense", "1", "1-", "0-0123456789abcdef", "1-0123456789ABCDEF", "01-x"],
)
async def test_an_id_the_store_never_gave_replays_nothing(
    store_url: str, last: str
) -> None:
    async with open_event_store(store_url) as store:
        await store.store_event("s", MESSAGES[0])
        assert await replay(store, last) == (None, [])


async def test_an_id_with_the_wrong_random_part_replays_nothing(
    store_url: str,
) -> None:
    async with open_event_store(store_url) as store:
        first = await store.store_event("s", MESSAGES[0])
        await store.store_event("s", MESSAGES[1])
        seq, token = first.split("-")
        assert len(token) == 16
        guessed = f"{seq}-{'0' * 16 if token != '0' * 16 else '1' * 16}"
        assert await replay(store, guessed) == (None, [])


async def test_two_replicas_replay_what_the_other_stored(store_url: str) -> None:
    async with (
        open_event_store(store_url) as one,
        open_event_store(store_url) as two,
    ):
        prime = await one.store_event("_GET_stream", None)
        ids = [
            await (one if i % 2 else two).store_event("_GET_stream", message)
            for i, message in enumerate(MESSAGES)
        ]
        assert number(prime) < number(ids[0]) < number(ids[1]) < number(ids[2])
        assert await replay(two, prime) == (
            "_GET_stream",
            list(zip(ids, MESSAGES, strict=True)),
        )
        assert await replay(one, ids[0]) == (
            "_GET_stream",
            list(zip(ids[1:], MESSAGES[1:], strict=True)),
        )


async def test_a_purge_deletes_events_older_than_max_age(store_url: str) -> None:
    now = [1000.0]
    async with open_event_store(store_url, max_age=60, clock=lambda: now[0]) as store:
        old = await store.store_event("s", MESSAGES[0])
        now[0] += 30
        kept = await store.store_event("s", MESSAGES[1])
        now[0] += 30.5  # the first is 60.5 s old, the second 30.5 s
        assert await store.purge() == 1
        assert await replay(store, old) == (None, [])
        assert await replay(store, kept) == ("s", [])
        assert store.statistics().purged == 1


async def test_a_purge_keeps_the_newest_max_events(store_url: str) -> None:
    async with open_event_store(store_url, max_events=2) as store:
        ids = [await store.store_event("s", m) for m in MESSAGES]
        assert await store.purge() == 2
        assert await replay(store, ids[1]) == (None, [])
        assert await replay(store, ids[2]) == ("s", [(ids[3], MESSAGES[3])])


@pytest.mark.realtime  # the purge task sleeps on the real clock
async def test_the_store_purges_by_itself_every_purge_interval(
    tmp_path: Path,
) -> None:
    async with open_event_store(
        f"sqlite:///{tmp_path}/events.db", max_age=0.01, purge_interval=0.05
    ) as store:
        await store.store_event("s", MESSAGES[0])
        with trio.fail_after(60):
            while store.statistics().purged == 0:  # noqa: ASYNC110
                await trio.sleep(0.05)
        assert store.statistics().purged == 1


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"url": 5}, TypeError, "url must be a string, not 5"),
        (
            {"url": "mysql://db"},
            ValueError,
            "url must look like sqlite:///path/to/events.db or "
            "postgresql://host/database, not 'mysql://db'",
        ),
        (
            {"url": "sqlite:///"},
            ValueError,
            "url must look like sqlite:///path/to/events.db or "
            "postgresql://host/database, not 'sqlite:///'",
        ),
        ({"max_age": 0}, ValueError, "max_age must be > 0 and finite, not 0"),
        ({"max_age": -1}, ValueError, "max_age must be >= 0, not -1"),
        ({"max_age": math.inf}, ValueError, "max_age must be > 0 and finite, not inf"),
        (
            {"max_age": "60"},
            TypeError,
            "max_age must be a number of seconds, not str '60'",
        ),
        ({"max_events": 0}, ValueError, "max_events must be >= 1, not 0"),
        ({"max_events": 1.5}, TypeError, "max_events must be an int, not 1.5"),
        (
            {"purge_interval": 0},
            ValueError,
            "purge_interval must be > 0 and finite, not 0",
        ),
        ({"timeout": math.nan}, ValueError, "timeout must be >= 0, not nan"),
    ],
)
async def test_bad_arguments_are_refused_naming_them(
    tmp_path: Path, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    arguments: dict[str, Any] = {"url": f"sqlite:///{tmp_path}/events.db", **options}
    with pytest.raises(error) as raised:
        async with open_event_store(**arguments):
            pass  # pragma: no cover
    assert str(raised.value) == message
    assert not (tmp_path / "events.db").exists()  # refused before anything was made


def write_lock(path: Path) -> sqlite3.Connection:
    """Another process's transaction holding the file's write lock."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    return other


@pytest.mark.realtime  # the store waits for SQLite's lock on the real clock
async def test_a_locked_file_is_an_outage_events_go_out_unstored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "events.db"
    async with open_event_store(f"sqlite:///{path}", timeout=0.2) as store:
        before = await store.store_event("s", MESSAGES[0])
        other = write_lock(path)
        try:
            with caplog.at_level(logging.WARNING, "trio_graceful.mcp"):
                lost = await store.store_event("s", MESSAGES[1])
            # WAL: a replay reads while another process holds the write lock.
            assert await replay(store, before) == ("s", [])
        finally:
            other.execute("COMMIT")
            other.close()
        after = await store.store_event("s", MESSAGES[2])
        assert lost.startswith("0-")
        assert await replay(store, lost) == (None, [])
        assert await replay(store, before) == ("s", [(after, MESSAGES[2])])
        assert store.statistics() == EventStoreStatistics(
            stored=2, not_stored=1, replayed=1, purged=0
        )
    assert [r.getMessage() for r in caplog.records] == [
        "event of stream 's' not stored, so it cannot be replayed: database is locked"
    ]


@pytest.mark.realtime  # a real lock holds a real thread
async def test_a_cancelled_call_does_not_wait_for_the_database(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.db"
    t0 = time.monotonic()
    async with open_event_store(f"sqlite:///{path}", timeout=30) as store:
        other = write_lock(path)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store.store_event, "s", MESSAGES[0])
                await trio.testing.wait_all_tasks_blocked()
                # The waiting statement takes no thread from the server's tools.
                default = trio.to_thread.current_default_thread_limiter()
                assert default.borrowed_tokens == 0
                nursery.cancel_scope.cancel()
        except BaseException:
            other.close()
            raise
    # Neither the call nor the closing waited for the 30 s of the lock.
    assert time.monotonic() - t0 < 10
    other.execute("COMMIT")
    other.close()


async def test_a_postgresql_connection_that_broke_is_replaced(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    import psycopg

    async with open_event_store(postgres_url) as store:
        before = await store.store_event("s", MESSAGES[0])
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            [(killed,)] = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        assert killed == 1
        with caplog.at_level(logging.WARNING, "trio_graceful.mcp"):
            lost = await store.store_event("s", MESSAGES[1])
        after = await store.store_event("s", MESSAGES[2])
        assert lost.startswith("0-")
        assert await replay(store, before) == ("s", [(after, MESSAGES[2])])
        assert store.statistics().not_stored == 1
    [record] = caplog.records
    assert record.getMessage().startswith(
        "event of stream 's' not stored, so it cannot be replayed: "
        "terminating connection due to administrator command"
    )


@pytest.mark.realtime  # another process's lock, held for real time
async def test_opening_a_new_file_waits_while_another_process_holds_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.db"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE t (x)")
    # A reader of a file not yet in WAL mode: the store's change of journal
    # mode waits for it (SQLite's busy handler, for up to ``timeout``).
    other.execute("BEGIN")
    other.execute("SELECT * FROM t").fetchall()
    opened = trio.Event()

    async def open_and_store() -> None:
        async with open_event_store(f"sqlite:///{path}", timeout=30) as store:
            opened.set()
            await store.store_event("s", MESSAGES[0])

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(open_and_store)
            await trio.sleep(0.3)
            assert not opened.is_set()  # the journal mode waits for the reader
            other.execute("COMMIT")
            with trio.fail_after(60):
                await opened.wait()
        with contextlib.closing(sqlite3.connect(path)) as fresh:
            assert fresh.execute("PRAGMA journal_mode").fetchall() == [("wal",)]
    finally:
        other.close()
