"""Clients for the tests of examples/websocket_close_server.py.

`open_trio_websocket` opens a trio-websocket client on a TCP stream of its
own, which it closes: trio-websocket 0.12 leaves its socket open when the
server closes first.

`trio_client` and `websockets_clients` (asyncio, run in a thread with its own
event loop) send requests, collect answers and record how the connection
closed, the same way for both implementations.

`WireClient` speaks WebSocket at the frame level: wsproto parses what the
server sends, so a test sees exactly which frames arrive in which order, and
the client's own frames are encoded here, so it can send what a well-behaved
client never would (invalid UTF-8, frames after its CLOSE) or stay silent
where a library would answer a CLOSE by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import struct
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence

import attrs
import trio
import trio_websocket
import wsproto
import wsproto.events
from wsproto import ConnectionType, WSConnection

TEXT, BINARY, CLOSE = 0x1, 0x2, 0x8


def client_frame(opcode: int, payload: bytes) -> bytes:
    """Encode one final, masked client frame (RFC 6455, section 5.2)."""
    mask = os.urandom(4)
    length = len(payload)
    if length < 126:
        header = struct.pack("!BB", 0x80 | opcode, 0x80 | length)
    elif length < 1 << 16:
        header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, length)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, length)
    key = int.from_bytes((mask * (length // 4 + 1))[:length], "big")
    masked = (int.from_bytes(payload, "big") ^ key).to_bytes(length, "big")
    return header + mask + masked


def close_payload(code: int, reason: str = "") -> bytes:
    return struct.pack("!H", code) + reason.encode()


@attrs.define(eq=False)
class WireClient:
    """A WebSocket client that does exactly what the test says, nothing more."""

    stream: trio.SocketStream
    _protocol: WSConnection = attrs.field(
        factory=lambda: WSConnection(ConnectionType.CLIENT)
    )
    _events: deque[wsproto.events.Event] = attrs.field(factory=deque)

    async def handshake(self) -> wsproto.events.Event | None:
        """Send the opening handshake; return the server's answer (None at EOF)."""
        request = wsproto.events.Request(host="127.0.0.1", target="/")
        await self.stream.send_all(self._protocol.send(request))
        return await self.receive()

    async def send_frame(self, opcode: int, payload: bytes) -> None:
        await self.stream.send_all(client_frame(opcode, payload))

    async def send_text(self, text: str) -> None:
        await self.send_frame(TEXT, text.encode())

    async def send_request(self, request_id: int, work_ms: int) -> None:
        await self.send_text(json.dumps({"id": request_id, "work_ms": work_ms}))

    async def send_close(self, code: int, reason: str = "") -> None:
        await self.send_frame(CLOSE, close_payload(code, reason))

    async def receive(self) -> wsproto.events.Event | None:
        """Return the next event the server caused; None once TCP is closed."""
        while not self._events:
            try:
                data = await self.stream.receive_some()
            except trio.BrokenResourceError:  # reset by the server
                data = b""
            if not data:
                return None
            self._protocol.receive_data(data)
            self._events.extend(self._protocol.events())
        return self._events.popleft()

    async def receive_json(self) -> object:
        event = await self.receive()
        assert isinstance(event, wsproto.events.TextMessage), event
        assert event.message_finished
        return json.loads(event.data)

    async def receive_close(self) -> tuple[int, str | None]:
        event = await self.receive()
        assert isinstance(event, wsproto.events.CloseConnection), event
        return event.code, event.reason

    async def receive_eof(self) -> None:
        event = await self.receive()
        assert event is None, event


@contextlib.asynccontextmanager
async def open_wire_client(
    port: int, *, handshake: bool = True
) -> AsyncIterator[WireClient]:
    """Connect a `WireClient` and, unless told not to, open the WebSocket."""
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        client = WireClient(stream)
        if handshake:
            event = await client.handshake()
            assert isinstance(event, wsproto.events.AcceptConnection), event
        yield client


@contextlib.asynccontextmanager
async def open_trio_websocket(
    port: int,
) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """Connect a trio-websocket client; close it (CLOSE 1000) unless closed."""
    async with (
        await trio.open_tcp_stream("127.0.0.1", port) as stream,
        trio.open_nursery() as nursery,
    ):
        ws = await trio_websocket.wrap_client_stream(nursery, stream, "127.0.0.1", "/")
        yield ws
        await ws.aclose()
        nursery.cancel_scope.cancel()


@attrs.define
class ClientResult:
    """What one client sent and saw."""

    sent: list[int] = attrs.field(factory=list)
    answered: list[int] = attrs.field(factory=list)
    close_code: int | None = None
    close_reason: str | None = None
    clean: bool = False
    """The close handshake completed (for `websockets`: both CLOSE frames
    with 1000 or 1001, then the TCP close)."""


async def trio_client(
    port: int, requests: Iterable[tuple[int, int]], *, every: float | None = None
) -> ClientResult:
    """Send ``(id, work_ms)`` requests (every ``every`` seconds, or all at
    once) until the server closes; collect the answers meanwhile."""
    result = ClientResult()
    async with open_trio_websocket(port) as ws, trio.open_nursery() as nursery:

        async def send() -> None:
            with contextlib.suppress(trio_websocket.ConnectionClosed):
                for request_id, work_ms in requests:
                    message = json.dumps({"id": request_id, "work_ms": work_ms})
                    await ws.send_message(message)
                    result.sent.append(request_id)
                    if every is not None:
                        await trio.sleep(every)

        nursery.start_soon(send)
        try:
            while True:
                result.answered.append(json.loads(await ws.get_message())["id"])
        except trio_websocket.ConnectionClosed as exc:
            if exc.reason is not None:
                result.close_code = exc.reason.code
                result.close_reason = exc.reason.reason
                result.clean = exc.reason.code in (1000, 1001)
        nursery.cancel_scope.cancel()
    return result


async def _websockets_client(
    url: str, requests: Iterable[tuple[int, int]], every: float | None
) -> ClientResult:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, ConnectionClosedError

    result = ClientResult()
    async with connect(url) as ws:

        async def send() -> None:
            with contextlib.suppress(ConnectionClosed):
                for request_id, work_ms in requests:
                    await ws.send(json.dumps({"id": request_id, "work_ms": work_ms}))
                    result.sent.append(request_id)
                    if every is not None:
                        await asyncio.sleep(every)

        sender = asyncio.ensure_future(send())
        try:
            async for message in ws:  # ends at a clean close
                result.answered.append(json.loads(message)["id"])
            result.clean = True
        except ConnectionClosedError:
            result.clean = False
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender
        result.close_code, result.close_reason = ws.close_code, ws.close_reason
    return result


def websockets_clients(
    url: str,
    plans: Sequence[Iterable[tuple[int, int]]],
    *,
    every: float | None = None,
    timeout: float = 30,
) -> list[ClientResult]:
    """Run one `websockets` client per plan on a new asyncio event loop.

    Blocks: call it in a thread (``trio.to_thread.run_sync``).
    """

    async def main() -> list[ClientResult]:
        clients = [_websockets_client(url, plan, every) for plan in plans]
        return list(await asyncio.wait_for(asyncio.gather(*clients), timeout))

    return asyncio.run(main())
