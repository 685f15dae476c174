"""Resuming an event stream on another replica: two real server processes,
one shared event store, raw HTTP to see the events, their ids and the 404."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest

from tests.support.mcp_replica import RETRY_MS
from tests.support.processes import PATIENCE, ProcessLog, open_logged_process

pytestmark = pytest.mark.realtime  # real processes on real sockets

LISTENING = r"listening on (http://127\.0\.0\.1:\d+)"
VERSION = "2025-11-25"  # the first with priming events and retry hints


@attrs.frozen
class Event:
    """One server-sent event, as the client parsed it."""

    id: str | None
    data: str
    retry: int | None


async def events(response: httpx.Response) -> AsyncIterator[Event]:
    """The events of an SSE body, as they arrive."""
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line.startswith(":"):  # a comment: sse-starlette's pings
            continue
        if line:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
            continue
        if fields:
            retry = fields.get("retry")
            yield Event(
                fields.get("id"), fields.get("data", ""), int(retry) if retry else None
            )
        fields = {}


def text(event: Event) -> str:
    """The resource a notification says was updated."""
    uri: str = json.loads(event.data)["params"]["uri"]
    return uri


def number(event: Event) -> int:
    """The number that orders an event in the store."""
    assert event.id is not None
    return int(event.id.split("-")[0])


def headers(session: str | None = None, **more: str) -> dict[str, str]:
    given = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": VERSION,
        **{name.replace("_", "-"): value for name, value in more.items()},
    }
    if session is not None:
        given["mcp-session-id"] = session
    return given


async def post(
    http: httpx.AsyncClient, url: str, session: str | None, message: dict[str, Any]
) -> httpx.Response:
    response = await http.post(url, json=message, headers=headers(session))
    assert response.status_code in (200, 202), response.text
    return response


async def open_session(http: httpx.AsyncClient, url: str) -> str:
    """Initialize a session at ``url``; its id."""
    hello = await post(
        http,
        url,
        None,
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": VERSION,
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "1"},
            },
        },
    )
    session = hello.headers["mcp-session-id"]
    await post(
        http, url, session, {"jsonrpc": "2.0", "method": "notifications/initialized"}
    )
    return session


def call(
    request_id: int, start: int, stop: int, *, close_first: bool = False
) -> dict[str, Any]:
    """A call of the replica's ``announce`` tool."""
    arguments = {"start": start, "stop": stop, "close_first": close_first}
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "announce", "arguments": arguments},
    }


async def test_a_stream_closed_on_one_replica_resumes_on_the_other(
    store_url: str,
) -> None:
    command = [sys.executable, "-m", "tests.support.mcp_replica", store_url]
    async with (
        open_logged_process(command, ProcessLog, ready=LISTENING) as one,
        open_logged_process(command, ProcessLog, ready=LISTENING) as two,
        httpx.AsyncClient(timeout=PATIENCE) as http,
    ):
        assert one.ready is not None
        assert two.ready is not None
        at_one, at_two = one.ready[1] + "/mcp", two.ready[1] + "/mcp"
        session = await open_session(http, at_one)
        async with http.stream("GET", at_one, headers=headers(session)) as stream:
            assert stream.status_code == 200
            arriving = events(stream)
            await post(http, at_one, session, call(1, 0, 1))
            first = await anext(arriving)
            # The server ends the stream, then sends two more: stored only.
            await post(http, at_one, session, call(2, 1, 3, close_first=True))
            assert [event async for event in arriving] == []
        assert first.id is not None

        # The session lives in the first process: the second does not know it.
        unknown = await http.get(
            at_two, headers=headers(session, last_event_id=first.id)
        )
        assert unknown.status_code == 404

        # A session of the second replica resumes the stream from the store.
        other = await open_session(http, at_two)
        async with http.stream(
            "GET", at_two, headers=headers(other, last_event_id=first.id)
        ) as stream:
            assert stream.status_code == 200
            arriving = events(stream)
            missed = [await anext(arriving), await anext(arriving)]
            primed = await anext(arriving)
            # Now the stream is the new session's: its own news comes live.
            await post(http, at_two, other, call(1, 3, 4))
            live = await anext(arriving)
            await post(http, at_two, other, call(2, 4, 4, close_first=True))
            assert [event async for event in arriving] == []
        # Priming events are not replayed: the two missed, then the new
        # stream's own priming event with the retry hint, then news.
        assert [text(e) for e in [first, *missed, live]] == [
            f"announcement://{n}" for n in range(4)
        ]
        assert (primed.data, primed.retry) == ("", RETRY_MS)
        numbers = [number(e) for e in [first, *missed, primed, live]]
        assert numbers == sorted(set(numbers))


async def test_a_replay_sends_the_stream_of_its_id_and_no_other_sessions(
    store_url: str,
) -> None:
    command = [sys.executable, "-m", "tests.support.mcp_replica", store_url]
    async with (
        open_logged_process(command, ProcessLog, ready=LISTENING) as one,
        httpx.AsyncClient(timeout=PATIENCE) as http,
    ):
        assert one.ready is not None
        url = one.ready[1] + "/mcp"
        a, b = await open_session(http, url), await open_session(http, url)
        async with (
            http.stream("GET", url, headers=headers(a)) as at_a,
            http.stream("GET", url, headers=headers(b)) as at_b,
        ):
            assert (at_a.status_code, at_b.status_code) == (200, 200)
            to_a, to_b = events(at_a), events(at_b)
            await post(http, url, a, call(1, 0, 1))
            first = await anext(to_a)
            # Both sessions' standalone streams have the SDK's one name,
            # and b's events are stored after a's first, in one store.
            await post(http, url, b, call(1, 100, 102))
            assert [text(await anext(to_b)) for _ in range(2)] == [
                "announcement://100",
                "announcement://101",
            ]
            await post(http, url, a, call(2, 1, 2, close_first=True))
            assert [event async for event in to_a] == []
            await post(http, url, b, call(2, 102, 102, close_first=True))
            assert [event async for event in to_b] == []
        assert text(first) == "announcement://0"
        assert first.id is not None

        async with http.stream(
            "GET", url, headers=headers(a, last_event_id=first.id)
        ) as stream:
            assert stream.status_code == 200
            arriving = events(stream)
            replayed: list[str] = []
            # Up to the new stream's priming event: what the replay sent.
            while (event := await anext(arriving)).data:
                replayed.append(text(event))
            await post(http, url, a, call(3, 2, 2, close_first=True))
            assert [event async for event in arriving] == []
        # Without a view per session, b's two came first.
        assert replayed == ["announcement://1"]
        assert event.retry == RETRY_MS
