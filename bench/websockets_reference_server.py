"""The WebSocket example's protocol on the ``websockets`` library's asyncio server.

The point of comparison for bench_websocket_drain.py. It speaks the protocol
of ``examples/websocket_close_server.py``: text frames
``{"id": <int>, "work_ms": <int>}``, worked on concurrently and answered with
``{"id": <int>}`` as they finish. On SIGTERM or SIGINT it shuts down the way
that library provides: ``server.close()``, which stops accepting, sends
CLOSE 1001 to every connection and waits for the close handshakes, then
``await server.wait_closed()``. (Requests still in progress are not waited
for: their answers fail once the CLOSE has gone out.)

It logs ``listening on ws://HOST:PORT/`` when ready and
``drained N connections in S s`` when done, to stderr.

    python bench/websockets_reference_server.py --port 0
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from typing import Any

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed


async def answer(ws: ServerConnection, request_id: int, work_ms: int) -> None:
    await asyncio.sleep(work_ms / 1000)
    with contextlib.suppress(ConnectionClosed):
        await ws.send(json.dumps({"id": request_id}))


def parse(message: str | bytes) -> tuple[int, int]:
    request: Any = json.loads(message)
    request_id, work_ms = request["id"], request["work_ms"]
    if not (isinstance(request_id, int) and isinstance(work_ms, int)):
        raise ValueError("id and work_ms must be integers")
    return request_id, work_ms


async def handler(ws: ServerConnection) -> None:
    tasks: set[asyncio.Task[None]] = set()
    with contextlib.suppress(ConnectionClosed):
        async for message in ws:
            try:
                request_id, work_ms = parse(message)
            except (ValueError, KeyError, TypeError) as exc:
                await ws.send(json.dumps({"error": str(exc)}))
                continue
            task = asyncio.ensure_future(answer(ws, request_id, work_ms))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    for task in tasks:
        task.cancel()


async def main(host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    server = await serve(handler, host, port, ping_interval=None, backlog=4096)
    bound_host, bound_port = next(iter(server.sockets)).getsockname()[:2]
    print(f"listening on ws://{bound_host}:{bound_port}/", file=sys.stderr, flush=True)
    await stop.wait()
    started = time.perf_counter()
    connections = len(server.connections)
    server.close()  # close_connections=True: CLOSE 1001 to every connection
    await server.wait_closed()
    elapsed = time.perf_counter() - started
    print(
        f"drained {connections} connections in {elapsed:.6f} s",
        file=sys.stderr,
        flush=True,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    asyncio.run(main(args.host, args.port))
