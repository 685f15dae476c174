"""The WebSocket example's protocol on the same stack, without trio_graceful.

The baseline of bench_websocket_throughput.py for what trio_graceful adds per
request: the same WebSocket connection (``examples/websocket_connection.py``,
the sans-io protocol of ``websockets`` driven from Trio streams) and the same
replies, served by plain Trio nurseries, with no inbox, no bundle and no
graceful shutdown (SIGTERM ends it).

It logs ``listening on ws://HOST:PORT/`` when ready, to stderr.

    python bench/sansio_reference_server.py --port 0
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from websocket_connection import ConnectionClosed, WebSocket, accept_websocket


async def answer(ws: WebSocket, request_id: int, work_ms: int) -> None:
    await trio.sleep(work_ms / 1000)
    with contextlib.suppress(ConnectionClosed):
        await ws.send(json.dumps({"id": request_id}))


async def handle(stream: trio.SocketStream) -> None:
    async with stream:
        ws = await accept_websocket(stream, max_message=2**20)
        if ws is None:
            return
        async with trio.open_nursery() as nursery:
            try:
                while True:
                    for message in await ws.receive():
                        request = json.loads(message)
                        nursery.start_soon(
                            answer, ws, request["id"], request["work_ms"]
                        )
            except ConnectionClosed:
                nursery.cancel_scope.cancel()


async def main(host: str, port: int) -> None:
    listeners = await trio.open_tcp_listeners(port, host=host, backlog=4096)
    bound = listeners[0].socket.getsockname()
    print(f"listening on ws://{bound[0]}:{bound[1]}/", file=sys.stderr, flush=True)
    await trio.serve_listeners(handle, listeners)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8003)
    args = parser.parse_args()
    trio.run(functools.partial(main, args.host, args.port))
