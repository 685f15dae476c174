"""A Quart-Trio service that hears STOP in band and ends each reply properly.

The app is a ``quart_trio.QuartTrio`` served by
``trio_graceful.asgi.serve_asgi`` under ``trio_graceful.run``, as
``asgi_service.py`` serves a Starlette one:

* ``GET /work?ms=N``: works N ms, then answers ``{"worked_ms": N}``.
* ``GET /events?ms=M``: a server-sent-events stream, ``data: i`` every M ms
  (500 by default). At STOP it sends one last ``event: bye`` and ends.
* A WebSocket at ``/echo`` that echoes each message. At STOP it closes with
  1001 and waits for the client's CLOSE.
* The lifespan (``before_serving``, ``after_serving``) logs ``startup`` and
  ``shutdown``; the shutdown comes once the last connection has closed.

On SIGTERM or SIGINT the server drains: the listeners close, idle
connections close at once, every request received is answered and the last
response on each connection says ``Connection: close``; what still runs a
little before the end of ``--grace`` is cut off, and still ends its reply (a
503, or the last chunk of a stream). A second signal exits at once.

Run ``python examples/quart_service.py --port 8000``, then in another
terminal ``curl -N localhost:8000/events`` (or
``curl -i 'localhost:8000/work?ms=3000'``) and press Ctrl+C in the server's
terminal: the stream ends with ``event: bye`` (the work is answered, with
``Connection: close``), and only then does the lifespan log ``shutdown``.
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from collections.abc import AsyncIterator, Sequence

import trio
from quart import Response, request, websocket
from quart_trio import QuartTrio

import trio_graceful
import trio_graceful.asgi

GOING_AWAY = 1001
logger = logging.getLogger("quart_service")


def make_app() -> QuartTrio:
    app = QuartTrio(__name__)

    @app.before_serving
    async def startup() -> None:
        logger.info("startup")

    @app.after_serving
    async def shutdown() -> None:
        logger.info("shutdown")

    @app.route("/work")
    async def work() -> dict[str, int]:
        ms = request.args.get("ms", 0, type=int)
        await trio.sleep(ms / 1000)
        return {"worked_ms": ms}

    @app.route("/events")
    async def events() -> Response:
        every = request.args.get("ms", 500, type=int) / 1000

        async def stream() -> AsyncIterator[str]:
            i = 0
            # The idle point: at STOP the sleep is cancelled and STOP returned.
            while await trio_graceful.asgi.until_stop(trio.sleep, every) is None:
                yield f"data: {i}\n\n"
                i += 1
            yield f"event: bye\ndata: {i}\n\n"

        response = Response(stream(), mimetype="text/event-stream")
        response.timeout = None  # Quart's RESPONSE_TIMEOUT would end it at 60 s
        return response

    @app.websocket("/echo")
    async def echo() -> None:
        while True:
            # Quart's receive() accepts the handshake, then takes the next
            # message from a memory channel: cancel-safe.
            message = await trio_graceful.asgi.until_stop(websocket.receive)
            if message is trio_graceful.STOP:
                break
            await websocket.send(message)
        await websocket.close(GOING_AWAY, "the server is shutting down")
        while True:
            # Until the client's CLOSE: Quart-Trio then cancels this handler.
            await websocket.receive()

    return app


async def serve(
    port: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    runner = trio_graceful.current_runner()
    server = await runner.start_service(
        functools.partial(trio_graceful.asgi.serve_asgi, bind=f"127.0.0.1:{port}"),
        make_app(),
        name="http",
    )
    logger.info("listening on %s", " ".join(server.urls))
    task_status.started()
    _, inbox = runner.root.open_inbox()
    await inbox.receive()  # STOP: returning now lets the server drain


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="A Quart-Trio service that hears STOP in band."
    )
    parser.add_argument("--port", type=int, default=8000, help="the port (0: any)")
    trio_graceful.add_run_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    return trio_graceful.run(serve, args.port, **trio_graceful.run_arguments(args))


if __name__ == "__main__":
    sys.exit(main())
