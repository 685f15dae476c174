"""The Starlette app the worker tests serve with ``python -m trio_graceful.asgi``.

* ``GET /work?ms=N&id=K`` answers ``{"id": K}`` after N ms on anyio's sleep,
  with the worker's process id in ``x-pid``.
* a WebSocket at ``/echo`` answers each text with the text and the worker's
  process id, until its server gets STOP: then it closes with 1001.

``$WORKERS_APP_MODE`` may name a file, read when a worker imports the app
(so a reload, a fresh interpreter, reads it again): ``fail`` makes the
import fail, ``hang`` makes the lifespan's startup wait forever (the worker
is never ready); anything else, or no file, serves.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from trio_graceful.asgi import wait_stop


def _mode() -> str:
    path = os.environ.get("WORKERS_APP_MODE")
    if not path or not Path(path).exists():
        return ""
    return Path(path).read_text().strip()


MODE = _mode()
if MODE == "fail":
    raise RuntimeError("this worker fails on purpose")


async def work(request: Request) -> JSONResponse:
    await anyio.sleep(int(request.query_params.get("ms", "0")) / 1000)
    return JSONResponse(
        {"id": request.query_params.get("id")}, headers={"x-pid": str(os.getpid())}
    )


async def echo(websocket: WebSocket) -> None:
    await websocket.accept()
    async with anyio.create_task_group() as tasks:

        async def close_at_stop() -> None:
            await wait_stop()
            await websocket.close(1001)
            tasks.cancel_scope.cancel()

        tasks.start_soon(close_at_stop)
        try:
            while True:
                text = await websocket.receive_text()
                await websocket.send_text(f"{text} {os.getpid()}")
        except WebSocketDisconnect:
            tasks.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    if MODE == "hang":
        await anyio.sleep_forever()
    yield


app = Starlette(
    routes=[Route("/work", work), WebSocketRoute("/echo", echo)], lifespan=lifespan
)
