"""Each session's view of an event store that sessions share: the streams of
one name stay apart, in our store and in one that is not ours."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp.server.streamable_http import EventMessage, EventStore
from mcp_types import JSONRPCMessage, JSONRPCNotification

from tests.support.mcp_http_resumable import ListEventStore
from trio_graceful.mcp import open_event_store
from trio_graceful.mcp._sessionevents import SessionEvents


def news(n: int) -> JSONRPCMessage:
    return JSONRPCNotification(jsonrpc="2.0", method="news", params={"n": n})


async def replay(
    store: EventStore, last: str
) -> tuple[str | None, list[JSONRPCMessage]]:
    """The stream a replay after ``last`` returns, and the messages it sends."""
    sent: list[EventMessage] = []

    async def send(event: EventMessage) -> None:
        sent.append(event)

    stream = await store.replay_events_after(last, send)
    return stream, [event.message for event in sent]


@pytest.fixture(params=["ours", "not ours"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[EventStore]:
    """A store of ours (what the view does is the same on PostgreSQL), or not."""
    if request.param == "ours":
        async with open_event_store(f"sqlite:///{tmp_path}/events.db") as ours:
            yield ours
    else:
        yield ListEventStore()


async def test_a_replay_sends_the_stream_of_its_id_in_one_session_only(
    store: EventStore,
) -> None:
    a, b = SessionEvents(store, "a"), SessionEvents(store, "b")
    first = await a.store_event("_GET_stream", news(0))
    for n in (100, 101):  # the other session's stream of the same name
        await b.store_event("_GET_stream", news(n))
    await a.store_event("1", news(200))  # a request's stream of a's
    await a.store_event("_GET_stream", news(1))

    expected = ("_GET_stream", [news(1)])
    assert await replay(a, first) == expected
    # The id is what lets a client replay its stream: in a new session
    # (another replica's) too.
    assert await replay(b, first) == expected
    assert await replay(SessionEvents(store, "c"), first) == expected


async def test_a_stream_stored_without_a_view_replays_under_its_own_name(
    store: EventStore,
) -> None:
    first = await store.store_event("_GET_stream", news(0))
    await store.store_event("_GET_stream", news(1))
    await SessionEvents(store, "a").store_event("_GET_stream", news(2))
    assert await replay(SessionEvents(store, "b"), first) == (
        "_GET_stream",
        [news(1)],
    )


async def test_an_id_the_store_does_not_know_replays_nothing(
    store: EventStore,
) -> None:
    view = SessionEvents(store, "a")
    await view.store_event("_GET_stream", news(0))
    assert await replay(view, "999") == (None, [])
