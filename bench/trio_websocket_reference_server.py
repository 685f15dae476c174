"""The WebSocket example's protocol on plain trio-websocket, without trio_graceful.

The baseline of bench_websocket_drain.py: how fast trio-websocket itself
closes idle connections, so that what trio_graceful adds can be told apart
from what Trio and trio-websocket cost. It speaks the example's protocol
(``{"id": <int>, "work_ms": <int>}`` answered with ``{"id": <int>}``) and on
SIGTERM or SIGINT does the shutdown by hand: it closes the listener, wakes
every handler through one `trio.Event`, and each sends CLOSE 1001 and waits
for the client's CLOSE. (Requests in progress are dropped, not waited for.)

It logs ``listening on ws://HOST:PORT/`` when ready and
``drained N connections in S s`` when done, to stderr.

    python bench/trio_websocket_reference_server.py --port 0
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import signal
import sys
import time

import trio
import trio_websocket


class Server:
    def __init__(self) -> None:
        self.stop = trio.Event()
        self.open = 0

    async def answer(
        self, ws: trio_websocket.WebSocketConnection, request_id: int, work_ms: int
    ) -> None:
        await trio.sleep(work_ms / 1000)
        with contextlib.suppress(trio_websocket.ConnectionClosed):
            await ws.send_message(json.dumps({"id": request_id}))

    async def read(
        self, ws: trio_websocket.WebSocketConnection, nursery: trio.Nursery
    ) -> None:
        try:
            while True:
                request = json.loads(await ws.get_message())
                nursery.start_soon(self.answer, ws, request["id"], request["work_ms"])
        except trio_websocket.ConnectionClosed:
            nursery.cancel_scope.cancel()

    async def handle(self, request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        self.open += 1
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.read, ws, nursery)
                await self.stop.wait()
                nursery.cancel_scope.cancel()
            await ws.aclose(1001, "the server is shutting down")
        finally:
            self.open -= 1


async def main(host: str, port: int) -> None:
    server = Server()
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as connections:
            async with trio.open_nursery() as listening:
                serve = functools.partial(
                    trio_websocket.serve_websocket,
                    server.handle,
                    host,
                    port,
                    None,
                    handler_nursery=connections,
                )
                ws_server = await listening.start(serve)
                print(
                    f"listening on ws://{host}:{ws_server.port}/",
                    file=sys.stderr,
                    flush=True,
                )
                await signals.__anext__()
                started = time.perf_counter()
                connections_open = server.open
                listening.cancel_scope.cancel()
            server.stop.set()
    elapsed = time.perf_counter() - started
    print(
        f"drained {connections_open} connections in {elapsed:.6f} s",
        file=sys.stderr,
        flush=True,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8002)
    args = parser.parse_args()
    trio.run(main, args.host, args.port)
