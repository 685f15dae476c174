"""A FastAPI service that answers every request it received when it is stopped.

The app is a ``fastapi.FastAPI`` on Trio (FastAPI runs on anyio, whose Trio
backend it gets here), served by ``trio_graceful.asgi.serve_asgi`` under
``trio_graceful.run``, as ``asgi_service.py`` serves a Starlette app:

* ``GET /work?ms=N``: works N ms, then answers ``{"worked_ms": N}``.
* ``GET /events?ms=M``: a server-sent-events stream, ``data: i`` every M ms
  (500 by default). At STOP it sends one last ``event: bye`` and ends.
* The lifespan logs ``startup`` and ``shutdown``; the shutdown comes once
  the last connection has closed.

On SIGTERM or SIGINT the server drains: the listeners close, every request
received is answered and the last response on each connection says
``Connection: close``; a second signal exits at once. The exit status is
that of the default ``trio_graceful.ExitCodes``: 0 after SIGTERM, 130 after
Ctrl+C.

Run ``python examples/fastapi_service.py --port 8000``, then in another
terminal ``curl -N localhost:8000/events`` (or
``curl -i 'localhost:8000/work?ms=3000'``) and press Ctrl+C in the server's
terminal: the stream ends with ``event: bye`` (the work is answered, with
``Connection: close``), and only then does the lifespan log ``shutdown``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

import trio
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

import trio_graceful
import trio_graceful.asgi

logger = logging.getLogger("fastapi_service")


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncGenerator[None]:
    logger.info("startup")
    yield
    logger.info("shutdown")


def make_app() -> FastAPI:
    app = FastAPI(lifespan=lifespan)

    @app.get("/work")
    async def work(ms: int = 0) -> dict[str, int]:
        await trio.sleep(ms / 1000)
        return {"worked_ms": ms}

    @app.get("/events")
    async def events(ms: int = 500) -> StreamingResponse:
        async def stream() -> AsyncIterator[str]:
            i = 0
            # The idle point: at STOP the sleep is cancelled and STOP returned.
            while await trio_graceful.asgi.until_stop(trio.sleep, ms / 1000) is None:
                yield f"data: {i}\n\n"
                i += 1
            yield f"event: bye\ndata: {i}\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

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
        description="A FastAPI service that answers every request it received."
    )
    parser.add_argument("--port", type=int, default=8000, help="the port (0: any)")
    trio_graceful.add_run_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    return trio_graceful.run(serve, args.port, **trio_graceful.run_arguments(args))


if __name__ == "__main__":
    sys.exit(main())
