"""One request's ASGI messages, watched so that a cut-off can end it properly.

An `Exchange` stands between the app and Hypercorn's stream: it passes each
message on and remembers how far the response got. When the request is cut
off at the server's deadline, `Exchange.finish` ends what the app left
open: a response not yet started becomes a 503 (with ``Connection: close``
if it is the last answer on an HTTP/1.1 connection),
a started one gets its last (empty) body message, which ends a chunked
response with its terminating chunk, and an accepted WebSocket gets CLOSE
1001.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import Any, cast

from hypercorn.typing import ASGISendEvent

from .._core._lowlevel import NoPublicConstructor

RETRY_AFTER = b"1"


class Progress(enum.Enum):
    """How far one request's response got."""

    WAITING = "waiting"  # nothing sent yet
    STARTED = "started"  # response headers sent (WebSocket: accepted)
    DONE = "done"  # the last body message sent (WebSocket: CLOSE sent)


# Message type -> the progress it makes; a body message is DONE only when it
# says there is no more body.
_STEPS: dict[str, Progress] = {
    "http.response.start": Progress.STARTED,
    "websocket.accept": Progress.STARTED,
    "websocket.close": Progress.DONE,
    "websocket.http.response.start": Progress.STARTED,
}


class Exchange(metaclass=NoPublicConstructor):
    """The ASGI ``send`` of one request, remembering how far the response got."""

    __slots__ = ("_send", "closed", "kind", "progress")

    def __init__(
        self, kind: str, send: Callable[[ASGISendEvent | None], Awaitable[None]]
    ) -> None:
        self.kind = kind
        self._send = send
        self.progress = Progress.WAITING
        self.closed = False

    async def send(self, message: ASGISendEvent) -> None:
        """The ``send`` callable the app gets.

        Once the stream is closed (`close_stream`), what the app still sends
        is dropped: a cut-off has answered for it.
        """
        if self.closed:
            return
        kind = message["type"]
        step = _STEPS.get(kind)
        if step is not None:
            self.progress = step
        elif kind in ("http.response.body", "websocket.http.response.body") and not (
            cast("dict[str, Any]", message).get("more_body", False)
        ):
            self.progress = Progress.DONE
        await self._send(message)

    async def refuse(self) -> None:
        """Answer 503 with ``Retry-After``.

        During a drain the HTTP/1.1 protocol adds ``Connection: close`` if it
        is the last answer of its connection; HTTP/2 forbids the header.
        """
        start = "http.response.start"
        body = "http.response.body"
        if self.kind == "websocket":
            start = "websocket.http.response.start"
            body = "websocket.http.response.body"
        await self.send(
            cast(
                "ASGISendEvent",
                {
                    "type": start,
                    "status": 503,
                    "headers": [
                        (b"content-length", b"0"),
                        (b"retry-after", RETRY_AFTER),
                    ],
                },
            )
        )
        await self.send(cast("ASGISendEvent", {"type": body, "body": b""}))

    async def finish(self) -> str:
        """End what the app left open at a cut-off; return what was done.

        Raises:
            h11.LocalProtocolError: if a response with a ``Content-Length``
                was cut before all of its body went out; only closing the
                connection can end it.
        """
        if self.progress is Progress.WAITING:
            await self.refuse()
            return "refused with 503"
        if self.kind == "websocket":
            await self.send(
                cast(
                    "ASGISendEvent",
                    {"type": "websocket.close", "code": 1001, "reason": "shutdown"},
                )
            )
            return "closed with 1001"
        await self.send(
            cast(
                "ASGISendEvent",
                {"type": "http.response.body", "body": b"", "more_body": False},
            )
        )
        return "response ended"

    async def close_stream(self) -> None:
        """Tell Hypercorn's stream that the app has finished (``send(None)``), once."""
        if not self.closed:
            self.closed = True
            await self._send(None)
