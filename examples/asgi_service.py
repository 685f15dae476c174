"""A Starlette service that loses no request when it is stopped.

The app runs on Trio (Starlette's anyio backend) and is served by
``trio_graceful.asgi.serve_asgi`` (Hypercorn's protocols) under
``trio_graceful.run``:

* ``GET /work?ms=N&id=K``: works N ms, then answers ``{"id": K}``.
* ``GET /stream?n=N&ms=M``: a server-sent-events stream of N events
  ``data: i`` one every M ms. After STOP it goes on; one that would outlast
  the server's cut-off ends itself, cleanly, before it.
* ``GET /readyz``: 200 while the program is ready, 503 from the first signal
  on (so during ``--drain-delay``).
* A WebSocket on any path: text messages ``{"id": K, "work_ms": N}``,
  answered ``{"id": K}`` in the order the work finishes, pipelined. At STOP
  the requests read are answered, then CLOSE 1001 goes out and the server
  waits for the client's CLOSE.
* ``--marker PATH``: the app's lifespan appends ``startup`` and
  ``shutdown <unix time>`` to the file.

On SIGTERM or SIGINT the server drains: listeners close, idle connections
close (a second after their last response at most), every request received
is answered, the last response on each connection says
``Connection: close``; a second signal exits at once.

Run ``python examples/asgi_service.py --port 8000``, then
``curl 'localhost:8000/work?ms=3000&id=1'`` and press Ctrl+C in the server's
terminal: the answer still comes, with ``Connection: close``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import signal
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from pathlib import Path

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from websocket_requests import InvalidRequest, answer, error_reply, parse_request

import trio_graceful
import trio_graceful.asgi

GOING_AWAY = 1001
UNSUPPORTED = 1003
# Ctrl+C asks for the same graceful shutdown as SIGTERM: both exit 0.
EXIT_CODES = trio_graceful.ExitCodes(
    clean_signals=frozenset({signal.SIGINT, signal.SIGTERM})
)


def _query_int(request: Request, name: str, default: int | None = None) -> int:
    value = request.query_params.get(name)
    if value is None and default is not None:
        return default
    if value is None or not value.isdigit() or len(value) > 9:
        raise ValueError(f"{name} must be a whole number, not {value!r}")
    return int(value)


# Seconds a stream leaves between its last event and the server's cut-off.
END_MARGIN = 0.5


async def work(request: Request) -> Response:
    try:
        ms = _query_int(request, "ms", 0)
        request_id = _query_int(request, "id")
    except ValueError as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)
    await trio.sleep(ms / 1000)
    return JSONResponse({"id": request_id})


async def stream(request: Request) -> Response:
    try:
        count = _query_int(request, "n")
        every = _query_int(request, "ms") / 1000
    except ValueError as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)

    async def events() -> AsyncIterator[str]:
        for i in range(count):
            if i:
                # End before the cut-off rather than be cut there, with room
                # for a late wake-up and the last chunk on a busy machine.
                ends_at = trio.current_time() + every + END_MARGIN
                if ends_at > trio_graceful.asgi.stop_deadline():
                    return
                await trio.sleep(every)
            yield f"data: {i}\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def readyz(request: Request) -> Response:
    ready = trio_graceful.current_runner().lifecycle.ready
    return JSONResponse({"ready": ready}, status_code=200 if ready else 503)


async def requests_over_websocket(websocket: WebSocket) -> None:
    await websocket.accept()
    in_flight = 0
    idle = trio.Event()
    idle.set()

    async def work_on(request_id: int, work_ms: int) -> None:
        nonlocal in_flight, idle
        try:
            await trio.sleep(work_ms / 1000)
            await websocket.send_text(answer(request_id))
        finally:
            in_flight -= 1
            if not in_flight:
                idle.set()

    async def read_until_idle() -> dict[str, object] | None:
        # After STOP, read only while requests are in flight: what arrives
        # meanwhile is worked on too; once idle, CLOSE goes out.
        async with trio.open_nursery() as nursery:
            result: dict[str, object] | None = None

            async def read() -> None:
                nonlocal result
                result = dict(await websocket.receive())
                nursery.cancel_scope.cancel()

            nursery.start_soon(read)
            await idle.wait()
            nursery.cancel_scope.cancel()
        return result

    close_code = GOING_AWAY
    async with trio.open_nursery() as nursery:
        while True:
            if trio_graceful.asgi.stop_received():
                message = await read_until_idle()
                if message is None:
                    break
            else:
                received = await trio_graceful.asgi.until_stop(websocket.receive)
                if received is trio_graceful.STOP:
                    continue
                message = dict(received)
            if message["type"] == "websocket.disconnect":
                return  # the client went away: nothing to answer
            text = message.get("text")
            if not isinstance(text, str):
                close_code = UNSUPPORTED
                break
            try:
                request_id, work_ms = parse_request(text)
            except InvalidRequest as exc:
                await websocket.send_text(error_reply(exc.request_id, str(exc)))
                continue
            in_flight += 1
            idle = trio.Event()
            nursery.start_soon(work_on, request_id, work_ms)
    await websocket.close(close_code)
    # Until the client's CLOSE: Starlette's receive_text() refuses to read
    # once the app has sent its own, the ASGI receive() does not.
    while (await websocket.receive())["type"] != "websocket.disconnect":
        pass


def make_app(marker: Path | None) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncGenerator[None]:
        if marker is not None:
            with marker.open("a") as file:
                file.write("startup\n")
        yield
        if marker is not None:
            with marker.open("a") as file:
                file.write(f"shutdown {time.time()}\n")

    return Starlette(
        routes=[
            Route("/work", work),
            Route("/stream", stream),
            Route("/readyz", readyz),
            WebSocketRoute("/{path:path}", requests_over_websocket),
        ],
        lifespan=lifespan,
    )


async def serve(
    port: int,
    marker: Path | None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    runner = trio_graceful.current_runner()
    server = await runner.start_service(
        functools.partial(trio_graceful.asgi.serve_asgi, bind=f"127.0.0.1:{port}"),
        make_app(marker),
        name="http",
    )
    logging.getLogger("asgi_service").info("listening on %s", " ".join(server.urls))
    task_status.started()
    _, inbox = runner.root.open_inbox()
    await inbox.receive()  # STOP: main returns, and the server drains


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="A Starlette service that loses no request when it is stopped."
    )
    parser.add_argument("--port", type=int, default=8000, help="the port (0: any)")
    parser.add_argument("--marker", type=Path, help="a file the lifespan appends to")
    trio_graceful.add_run_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    return trio_graceful.run(
        serve,
        args.port,
        args.marker,
        exit_codes=EXIT_CODES,
        **trio_graceful.run_arguments(args),
    )


if __name__ == "__main__":
    sys.exit(main())
