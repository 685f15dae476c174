"""Helpers for the tests of trio_graceful.asgi: a server in a bundle, raw clients.

`serving` runs `serve_asgi` as a child of a bundle and stops it the way a
runner does (`Bundle.shutdown`). `RawClient` speaks HTTP/1.1 with h11 over
any Trio stream: it pipelines, keeps connections alive, and tells a clean
close (EOF) from a reset. The tests that want exact virtual times serve on a
Unix socket: the kernel hands its data over within the ``send`` call, so the
mock clock never jumps while bytes are on their way, which loopback TCP
does not promise on a busy machine.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import attrs
import h11
import trio
import trio.testing

import trio_graceful
from trio_graceful.asgi import AsgiServer, serve_asgi

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@attrs.define(eq=False)
class Served:
    """A server running in a bundle, and how to stop it."""

    server: AsgiServer
    bundle: trio_graceful.Bundle
    path: Path | None
    report: trio_graceful.CancelReport | None = None
    clients: list[RawClient] = attrs.field(factory=list["RawClient"])

    async def connect(self) -> RawClient:
        """Open a connection: to the Unix socket, or the first TCP address."""
        if self.path is not None:
            stream: trio.abc.Stream = await trio.open_unix_socket(str(self.path))
        else:
            host, port = self.server.addresses[0]
            stream = await trio.open_tcp_stream(host, port)
        client = RawClient(stream)
        self.clients.append(client)  # closed when the test's server stops
        return client

    async def request(self, *targets: str) -> RawClient:
        """Connect, send ``targets`` pipelined, and wait until the server is idle."""
        client = await self.connect()
        await client.send(*targets)
        await trio.testing.wait_all_tasks_blocked()
        return client

    @contextlib.asynccontextmanager
    async def stopping(self, grace: float) -> AsyncIterator[None]:
        """Shut down with ``grace`` while the block runs; leave when both are done."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.shutdown, grace)
            yield

    async def shutdown(self, grace: float) -> trio_graceful.CancelReport:
        """STOP, then ``grace`` seconds: what a runner does to its services."""
        self.report = await self.bundle.shutdown(grace)
        return self.report


@contextlib.asynccontextmanager
async def serving(
    app: object, tmp_path: Path | None = None, **options: Any
) -> AsyncIterator[Served]:
    """Serve ``app`` on a Unix socket in ``tmp_path`` (or on loopback TCP)."""
    path = None if tmp_path is None else tmp_path / "server.sock"
    bind = "127.0.0.1:0" if path is None else f"unix:{path}"
    async with trio_graceful.open_bundle(name="test") as bundle:
        _, inbox = bundle.open_inbox()
        server = await bundle.start(
            functools.partial(serve_asgi, inbox, app, bind=bind, **options)
        )
        served = Served(server, bundle, path)
        try:
            yield served
        finally:
            for client in served.clients:
                await trio.aclose_forcefully(client.stream)
            if served.report is None:
                await bundle.shutdown(math.inf)


@attrs.frozen
class Answer:
    """One response, read whole."""

    status: int
    headers: dict[bytes, bytes]
    body: bytes
    chunked: bool

    @property
    def closes(self) -> bool:
        """True if the response said ``Connection: close``."""
        return self.headers.get(b"connection", b"").lower() == b"close"


@attrs.define(eq=False)
class RawClient:
    """An HTTP/1.1 client on one stream: pipelines, keeps alive, sees resets."""

    stream: trio.abc.Stream
    h11: h11.Connection = attrs.field(factory=lambda: h11.Connection(h11.CLIENT))
    raw: bytearray = attrs.field(factory=bytearray)
    """Every byte received."""
    extra: bytes = b""
    """What `end` read that no `answer` did."""

    async def send(self, *targets: str, host: str = "test") -> None:
        """Send a GET for each target, back to back (pipelined)."""
        data = b"".join(
            f"GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
            for target in targets
        )
        await self.stream.send_all(data)

    async def send_raw(self, data: bytes) -> None:
        """Send bytes as they are (a request cut in the middle, say)."""
        await self.stream.send_all(data)

    async def answer(self) -> Answer:
        """Read the next response."""
        if self.h11.our_state is h11.IDLE:
            # The requests went out as raw bytes (pipelined); h11 is told of
            # one at a time, so that it parses the response to it.
            self.h11.send(
                h11.Request(method="GET", target="/", headers=[("Host", "x")])
            )
            self.h11.send(h11.EndOfMessage())
        status = 0
        headers: dict[bytes, bytes] = {}
        body = bytearray()
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                data = await self._receive()
                self.h11.receive_data(data)
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = {name.lower(): value for name, value in event.headers}
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
                    self.h11.start_next_cycle()
                chunked = headers.get(b"transfer-encoding", b"").lower() == b"chunked"
                return Answer(status, headers, bytes(body), chunked)
            else:
                raise AssertionError(f"unexpected {event!r}")

    async def end(self) -> str:
        """Read until the server closes: ``"eof"`` or ``"reset"``.

        What comes before the close, and was not read as a response, is
        added to `extra`.
        """
        self.extra += self.h11.trailing_data[0]
        while True:
            try:
                data = await self._receive()
            except trio.BrokenResourceError:
                return "reset"
            if not data:
                return "eof"
            self.extra += data

    async def _receive(self) -> bytes:
        data = bytes(await self.stream.receive_some(65536))
        self.raw += data
        return data

    async def aclose(self) -> None:
        """Close the client's side."""
        await self.stream.aclose()


async def lifespan_only(receive: Receive, send: Send) -> None:
    """Answer a lifespan scope as an app without a lifespan of its own would."""
    while True:
        message = await receive()
        await send({"type": message["type"] + ".complete"})
        if message["type"] == "lifespan.shutdown":
            return
