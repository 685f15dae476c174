"""`SessionEvents`: one session's view of an event store that sessions share.

The SDK (``mcp`` 2.3.0) gives every session's transport the one event store
it was given, and names a stream only within its session: ``_GET_stream``
for each session's standalone stream, the JSON-RPC id (``"1"``...) for a
request's. In a store that sessions share, two sessions' streams of one name
would be one stream, and a replay after an event id would also send what the
other sessions stored under that name.

`streamable_http_app` gives each session's transport a `SessionEvents`
instead, which stores stream ``name`` of session ``S`` as ``"S name"``: a
session id is visible ASCII (the SDK checks it), so the first space ends it.
A replay then needs no filtering, and no help from the store: the SDK's
`~mcp.server.streamable_http.EventStore` contract is that a replay sends the
events of the given id's stream stored after it and returns that stream, now
one session's stream only. The view hands the SDK back the name within a
session. So an event id stays what lets a client replay a stream, its own,
in its session or in a new one on another replica; and no other.

A wrapper could not filter a replay itself: the events reach the callback
before the store says which stream they are of, and carry no stream.
"""

from __future__ import annotations

from typing import final

from mcp.server.streamable_http import (
    EventCallback,
    EventId,
    EventStore,
    StreamId,
)
from mcp_types import JSONRPCMessage

_SEPARATOR = " "  # in no session id: the SDK allows only 0x21-0x7E


@final
class SessionEvents(EventStore):
    """The streams of one session, in an event store that sessions share."""

    __slots__ = ("_prefix", "session_id", "store")

    def __init__(self, store: EventStore, session_id: str) -> None:
        self.store = store
        self.session_id = session_id
        self._prefix = f"{session_id}{_SEPARATOR}"

    async def store_event(
        self, stream_id: StreamId, message: JSONRPCMessage | None
    ) -> EventId:
        """Store ``message`` as an event of the view's stream ``stream_id``.

        A checkpoint if the store's ``store_event`` is.
        """
        return await self.store.store_event(self._prefix + stream_id, message)

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        """Replay the events of ``last_event_id``'s stream after it, whoever stored it.

        The id is enough, as the SDK expects: a client resumes its stream in
        a new session too (another replica's). A checkpoint if the store's
        ``replay_events_after`` is.

        Returns:
            The stream's name within its session (a stream stored without a
            view: its name as stored), or `None` if the store knows no such id.
        """
        stream = await self.store.replay_events_after(last_event_id, send_callback)
        if stream is None:
            return None
        _, separator, name = stream.partition(_SEPARATOR)
        return name if separator else stream
