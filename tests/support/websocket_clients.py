"""Clients for the tests of examples/websocket_close_server.py.

`pipelining_client` (trio-websocket) and `open_trio_websocket` are the
example's own clients, shared with examples/websocket_demo.py;
`websockets_clients` runs clients of the independent `websockets` library
(asyncio, in a thread with its own event loop) that record what they saw
in the same `ClientRecord`.

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
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence

import attrs
import trio
import wsproto
import wsproto.events
from wsproto import ConnectionType, WSConnection

from tests.support.examples import load_example

_clients = load_example("websocket_clients")
ClientRecord = _clients.ClientRecord
open_trio_websocket = _clients.open_trio_websocket
pipelining_client = _clients.pipelining_client

CONTINUATION, TEXT, BINARY, CLOSE, PING = 0x0, 0x1, 0x2, 0x8, 0x9


def client_frame(opcode: int, payload: bytes, *, fin: bool = True) -> bytes:
    """Encode one masked client frame (RFC 6455, section 5.2)."""
    mask = os.urandom(4)
    length = len(payload)
    first = (0x80 if fin else 0) | opcode
    if length < 126:
        header = struct.pack("!BB", first, 0x80 | length)
    elif length < 1 << 16:
        header = struct.pack("!BBH", first, 0x80 | 126, length)
    else:
        header = struct.pack("!BBQ", first, 0x80 | 127, length)
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

    async def handshake(self, target: str = "/") -> wsproto.events.Event | None:
        """Send the opening handshake; return the server's answer (None at EOF)."""
        request = wsproto.events.Request(host="127.0.0.1", target=target)
        await self.stream.send_all(self._protocol.send(request))
        return await self.receive()

    async def send_frame(
        self, opcode: int, payload: bytes, *, fin: bool = True
    ) -> None:
        await self.stream.send_all(client_frame(opcode, payload, fin=fin))

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
    port: int, *, handshake: bool = True, target: str = "/"
) -> AsyncIterator[WireClient]:
    """Connect a `WireClient` and, unless told not to, open the WebSocket at
    ``target``."""
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        client = WireClient(stream)
        if handshake:
            event = await client.handshake(target)
            assert isinstance(event, wsproto.events.AcceptConnection), event
        yield client


async def _websockets_client(
    url: str, requests: Iterable[tuple[int, int]], every: float | None
) -> ClientRecord:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    record = ClientRecord()
    async with connect(url, ping_interval=None) as ws:
        record.local_port = ws.local_address[1]

        async def send() -> None:
            with contextlib.suppress(ConnectionClosed):
                for request_id, work_ms in requests:
                    await ws.send(json.dumps({"id": request_id, "work_ms": work_ms}))
                    record.sent[request_id] = time.time()
                    await asyncio.sleep(every or 0)

        sender = asyncio.ensure_future(send())
        with contextlib.suppress(ConnectionClosed):
            async for message in ws:
                reply = json.loads(message)
                (record.refused if "error" in reply else record.answered).append(
                    reply["id"]
                )
        # The CLOSE came: recv() ends at once, before the TCP close.
        record.ended_at = time.time()
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender
        await ws.wait_closed()
        if ws.close_code is not None and ws.close_code != 1006:
            record.close_code = ws.close_code
            record.close_reason = ws.close_reason
        record.clean = ws.protocol.close_rcvd is not None
    return record


def websockets_clients(
    url: str,
    plans: Sequence[Iterable[tuple[int, int]]],
    *,
    every: float | None = None,
    timeout: float = 60,
) -> list[ClientRecord]:
    """Run one `websockets` client per plan on a new asyncio event loop.

    Blocks: call it in a thread (``trio.to_thread.run_sync``).
    """

    async def main() -> list[ClientRecord]:
        clients = [_websockets_client(url, plan, every) for plan in plans]
        return list(await asyncio.wait_for(asyncio.gather(*clients), timeout))

    return asyncio.run(main())
