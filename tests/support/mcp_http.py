"""An MCP server over Streamable HTTP as a real process, and a raw client for its bytes.

`open_server` starts ``examples/mcp_http_server.py`` (or another program of
the same command line) on port 0 and reads its log. `RawSession` speaks
Streamable HTTP over plain Trio sockets with `h11`, one connection per
request, so that a test sees what the SDK's client hides: status codes,
headers, the ``retry:`` field of an event stream, and whether a chunked
body ended with its terminating chunk or was cut.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import h11
import trio

from tests.support.asgi_process import Service
from tests.support.examples import EXAMPLES
from tests.support.processes import PATIENCE, open_logged_process

EXAMPLE = EXAMPLES / "mcp_http_server.py"
SERVING = r"serving http://127\.0\.0\.1:(\d+)/mcp"
STOP_LINE = r"trio_graceful\.asgi: STOP: draining"
VERSION = "2025-11-25"


@contextlib.asynccontextmanager
async def open_server(*args: str, program: Path = EXAMPLE) -> AsyncIterator[Service]:
    """Run ``program --port 0 *args``; yield it once it serves."""
    command = [sys.executable, str(program), "--port", "0", *args]
    async with open_logged_process(command, Service, ready=SERVING) as service:
        yield service


def events(body: bytes) -> list[dict[str, str]]:
    """The server-sent events of a body: each a dict of its fields."""
    found: list[dict[str, str]] = []
    for block in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        fields: dict[str, str] = {}
        for line in block.decode().split("\n"):
            name, _, value = line.partition(":")
            if name:
                fields[name] = value.strip()
        if fields:
            found.append(fields)
    return found


def messages(body: bytes) -> list[dict[str, Any]]:
    """The JSON-RPC messages among a body's events."""
    return [json.loads(e["data"]) for e in events(body) if e.get("data")]


@attrs.define(eq=False)
class Exchange:
    """One request on its own connection, and its response as far as it came."""

    stream: trio.SocketStream
    parser: h11.Connection
    status: int = 0
    headers: dict[bytes, bytes] = attrs.field(factory=dict[bytes, bytes])
    body: bytes = b""
    complete: bool = False
    """The whole response came: for a chunked one, its terminating chunk."""

    async def read(self, *, until: bytes | None = None) -> Exchange:
        """Read until the response is complete, or its body holds ``until``."""
        with trio.fail_after(PATIENCE):
            while not self.complete and not (until is not None and until in self.body):
                event = self.parser.next_event()
                if event is h11.NEED_DATA:
                    data = bytes(await self.stream.receive_some())
                    assert data, f"closed before the response ended: {self.body!r}"
                    self.parser.receive_data(data)
                elif isinstance(event, h11.Response):
                    self.status = event.status_code
                    self.headers = dict(event.headers)
                elif isinstance(event, h11.Data):
                    self.body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    self.complete = True
        if self.complete:  # as a client does, done with the connection
            await self.stream.aclose()
        return self

    async def read_headers(self) -> Exchange:
        with trio.fail_after(PATIENCE):
            while not self.status:
                event = self.parser.next_event()
                if event is h11.NEED_DATA:
                    self.parser.receive_data(bytes(await self.stream.receive_some()))
                elif isinstance(event, h11.Response):
                    self.status = event.status_code
                    self.headers = dict(event.headers)
        return self


@attrs.define(eq=False)
class RawSession:
    """A client's session, in raw HTTP: one connection per request."""

    port: int
    session_id: str | None = None
    _streams: list[trio.SocketStream] = attrs.field(factory=list[trio.SocketStream])

    async def connect(self) -> trio.SocketStream:
        """A connection, opened now (before STOP, for a request sent after)."""
        stream = await trio.open_tcp_stream("127.0.0.1", self.port)
        self._streams.append(stream)
        return stream

    async def send(
        self,
        method: str,
        message: dict[str, Any] | None = None,
        *,
        stream: trio.SocketStream | None = None,
        headers: dict[str, str] | None = None,
    ) -> Exchange:
        """Send one request; return its `Exchange` (nothing read yet)."""
        if stream is None:
            stream = await self.connect()
        body = b"" if message is None else json.dumps(message).encode()
        sent = {
            "Host": f"127.0.0.1:{self.port}",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": VERSION,
            "Content-Length": str(len(body)),
            **({"Content-Type": "application/json"} if message is not None else {}),
            **({"Mcp-Session-Id": self.session_id} if self.session_id else {}),
            **(headers or {}),
        }
        parser = h11.Connection(h11.CLIENT)
        head = h11.Request(method=method, target="/mcp", headers=list(sent.items()))
        data = parser.send(head) or b""
        if body:
            data += parser.send(h11.Data(data=body)) or b""
        data += parser.send(h11.EndOfMessage()) or b""
        await stream.send_all(data)
        return Exchange(stream, parser)

    async def initialize(self) -> None:
        """Open the session: ``initialize``, then ``notifications/initialized``."""
        reply = await (await self.send("POST", INITIALIZE)).read()
        assert reply.status == 200, reply
        self.session_id = reply.headers[b"mcp-session-id"].decode()
        reply = await (await self.send("POST", INITIALIZED)).read()
        assert reply.status == 202, reply

    async def aclose(self) -> None:
        for stream in self._streams:
            await stream.aclose()


@contextlib.asynccontextmanager
async def open_raw_session(port: int) -> AsyncIterator[RawSession]:
    session = RawSession(port)
    try:
        await session.initialize()
        yield session
    finally:
        await session.aclose()


def request(request_id: int, method: str, **params: object) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def tool_call(request_id: int, tool: str, **arguments: object) -> dict[str, Any]:
    return request(request_id, "tools/call", name=tool, arguments=arguments)


INITIALIZE = request(
    0,
    "initialize",
    protocolVersion=VERSION,
    capabilities={},
    clientInfo={"name": "tests", "version": "1"},
)
INITIALIZED: dict[str, Any] = {"jsonrpc": "2.0", "method": "notifications/initialized"}
