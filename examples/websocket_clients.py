"""Clients that pipeline requests to ``examples/websocket_close_server.py``.

They behave like real clients during a shutdown: they keep sending until the
server's CLOSE reaches them, as they cannot know sooner. Each records what it
saw, so that what happened to every request can be told from the client's
side: answered, refused, or sent and never replied to. Used by
``examples/websocket_demo.py`` and by the tests.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import AsyncGenerator, Iterable

import attrs
import trio
import trio_websocket

ON_THE_WIRE = 0.02
"""Seconds: a request sent this shortly before the connection ended may have
crossed the server's CLOSE on the wire; no reply is owed for it."""


@attrs.define
class ClientRecord:
    """What one client sent and saw.

    Times are `time.time`, comparable with other processes' clocks and logs.
    """

    sent: dict[int, float] = attrs.field(factory=dict[int, float])
    """Request id -> when it was sent (when the send returned)."""
    local_port: int = 0
    answered: list[int] = attrs.field(factory=list[int])
    refused: list[int] = attrs.field(factory=list[int])
    """Requests answered ``{"id": N, "error": "shutting down"}``."""
    close_code: int | None = None
    """The code of the server's CLOSE; None if the connection just dropped."""
    close_reason: str | None = None
    clean: bool = False
    """The close handshake completed: CLOSE both ways."""
    ended_at: float | None = None
    """When the CLOSE came, or the connection dropped."""

    def unanswered(self, end: float | None = None) -> list[int]:
        """Requests sent well before the end that got no reply at all.

        The end is when the client saw the connection end, unless given (a
        busy client may see it late, and keep sending meanwhile).
        """
        replied = {*self.answered, *self.refused}
        end = end or self.ended_at or time.time()
        return sorted(
            request_id
            for request_id, at in self.sent.items()
            if request_id not in replied and at < end - ON_THE_WIRE
        )

    def on_the_wire(self) -> int:
        """Requests without a reply, sent at most `ON_THE_WIRE` before the end."""
        replied = len(self.answered) + len(self.refused)
        return len(self.sent) - replied - len(self.unanswered())


def random_requests(
    first_id: int, rng: random.Random, work_ms: tuple[int, int]
) -> Iterable[tuple[int, int]]:
    """Endless ``(id, work_ms)`` pairs with random work, ids from ``first_id``."""
    request_id = first_id
    while True:
        yield request_id, rng.randint(*work_ms)
        request_id += 1


@contextlib.asynccontextmanager
async def open_trio_websocket(
    port: int,
) -> AsyncGenerator[trio_websocket.WebSocketConnection]:
    """Connect a trio-websocket client; close it (CLOSE 1000) unless closed.

    The client owns its TCP stream: trio-websocket 0.12's own client leaves
    its socket open when the server closes first.
    """
    async with (
        await trio.open_tcp_stream("127.0.0.1", port) as stream,
        trio.open_nursery() as nursery,
    ):
        ws = await trio_websocket.wrap_client_stream(nursery, stream, "127.0.0.1", "/")
        yield ws
        await ws.aclose()
        nursery.cancel_scope.cancel()


async def pipelining_client(
    port: int,
    requests: Iterable[tuple[int, int]],
    record: ClientRecord,
    *,
    pause: tuple[float, float] | None = None,
    rng: random.Random | None = None,
) -> None:
    """Send ``requests`` until the server closes; record every reply.

    Between requests it waits a random time in ``pause`` (seconds), or not
    at all. Returns once the connection has ended.
    """
    rng = rng or random.Random()
    async with open_trio_websocket(port) as ws, trio.open_nursery() as nursery:
        record.local_port = ws.local.port  # type: ignore[union-attr]

        async def send() -> None:
            with contextlib.suppress(trio_websocket.ConnectionClosed):
                for request_id, work_ms in requests:
                    message = json.dumps({"id": request_id, "work_ms": work_ms})
                    await ws.send_message(message)
                    record.sent[request_id] = time.time()  # now in the kernel
                    await trio.sleep(0 if pause is None else rng.uniform(*pause))

        nursery.start_soon(send)
        try:
            while True:
                reply = json.loads(await ws.get_message())
                if "error" in reply:
                    record.refused.append(reply["id"])
                else:
                    record.answered.append(reply["id"])
        except trio_websocket.ConnectionClosed as exc:
            record.ended_at = time.time()
            if exc.reason is not None and exc.reason.code != 1006:
                record.close_code = exc.reason.code
                record.close_reason = exc.reason.reason
                record.clean = True  # trio-websocket answers the CLOSE
        nursery.cancel_scope.cancel()
