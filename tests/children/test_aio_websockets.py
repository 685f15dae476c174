"""A real asyncio library as a bundle child: a `websockets` server.

The server is the websockets library's own asyncio implementation, run by
run_asyncio on the trio-asyncio loop; the clients are trio-websocket
clients on real loopback sockets. On STOP the server closes the way
websockets closes a server, so each client gets a CLOSE frame with code
1001 (going away) before the grace is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator

import pytest
import trio
import trio_websocket
from websockets.asyncio.server import ServerConnection, serve

from tests.support.asyncio_bridge import trio_asyncio
from tests.support.examples import load_example
from trio_graceful import AsyncioInbox, ChildOutcome, open_bundle, run_asyncio

pytestmark = pytest.mark.realtime


async def echo(connection: ServerConnection) -> None:
    async for message in connection:
        await connection.send(f"echo: {message}")


async def websocket_server(inbox: AsyncioInbox[object], *, task_status) -> str:
    """Serve until STOP, then close every connection with 1001 and return."""
    async with serve(echo, "127.0.0.1", 0) as server:
        task_status.started(server.sockets[0].getsockname()[1])
        await inbox.receive()  # STOP: leaving the block closes the server
    return "closed"


@contextlib.asynccontextmanager
async def connect(port: int) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """A trio-websocket client on a TCP stream that the test closes itself.

    (A trio-websocket client leaves its stream to the garbage collector when
    the server ends the connection, which the warnings filter would catch.)
    """
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream, trio.open_nursery() as nursery:
        yield await trio_websocket.wrap_client_stream(nursery, stream, "127.0.0.1", "/")


async def test_websockets_server_shuts_down_gracefully_on_stop():
    closes: list[tuple[int, str]] = []
    replies: list[str] = []

    async def client(port: int, name: str, *, task_status) -> None:
        async with connect(port) as ws:
            await ws.send_message(name)
            replies.append(await ws.get_message())
            task_status.started()
            try:
                await ws.get_message()
            except trio_websocket.ConnectionClosed as exc:
                closes.append((exc.reason.code, name))

    async with trio_asyncio.open_loop(), trio.open_nursery() as clients:
        with trio.fail_after(30):  # a safety net; the test takes milliseconds
            async with open_bundle(name="aio-server") as bundle:
                port = await bundle.start(
                    run_asyncio, websocket_server, name="websockets"
                )
                for name in ("ann", "bob", "cyd"):
                    await clients.start(client, port, name)
                t0 = trio.current_time()
                report = await bundle.shutdown(grace=10)
                elapsed = trio.current_time() - t0
    assert sorted(replies) == ["echo: ann", "echo: bob", "echo: cyd"]
    assert sorted(closes) == [(1001, "ann"), (1001, "bob"), (1001, "cyd")]
    assert report.graceful
    assert [(c.name, c.outcome) for c in report.children] == [
        ("websockets", ChildOutcome.FINISHED)
    ]
    assert elapsed < 5  # generous: it takes a few milliseconds


async def test_websockets_server_that_ignores_stop_is_bounded_by_the_grace():
    # The same server without reading its inbox: it never hears STOP, so the
    # grace runs out and the hard cancel ends it.
    async def deaf_server(inbox: AsyncioInbox[object], *, task_status) -> None:
        async with serve(echo, "127.0.0.1", 0) as server:
            task_status.started(server.sockets[0].getsockname()[1])
            await asyncio.Future()  # forever

    closes: list[int] = []
    async with trio_asyncio.open_loop(), open_bundle() as bundle:
        port = await bundle.start(run_asyncio, deaf_server)
        async with connect(port) as ws:
            await ws.send_message("hi")
            assert await ws.get_message() == "echo: hi"
            report = await bundle.shutdown(grace=0.5)
            # Leaving `async with serve()` closed the server synchronously,
            # before its wait for the connections was cancelled: the client
            # still gets its CLOSE frame.
            with pytest.raises(trio_websocket.ConnectionClosed) as info:
                await ws.get_message()
            closes.append(info.value.reason.code)
    assert closes == [1001]
    assert report.children[0].outcome is ChildOutcome.CANCELLED
    assert 0.5 <= report.elapsed < 5
    assert report.hard_cancelled_at == report.hard_deadline


async def test_children_example_stops_a_thread_a_process_and_asyncio_code(capsys):
    example = load_example("children_shutdown")
    with trio.fail_after(30):
        report = await example.main(grace=5)
    assert report.graceful
    assert report.elapsed < 5
    assert sorted(c.name for c in report.children) == ["copier", "helper", "websockets"]
    (helper,) = [c for c in report.children if c.name == "helper"]
    assert re.fullmatch(
        r"process \d+ \(python\): got SIGTERM on STOP; exited with status 0",
        helper.notes[0],
    )
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [
        "helper: ready",
        "client: got 'hello'",
        "main: shutdown(grace=5)",
    ]
    assert set(out[3:6]) >= {
        "client: closed by the server with 1001",
        "helper: got SIGTERM, cleaning up",
    }
    assert any(re.fullmatch(r"copier: stopped after \d+ chunks", line) for line in out)
    assert out[-4] == report.summary()
