"""The Starlette app that the ASGI benchmarks serve with each server.

One route, ``GET /work?ms=N&id=K``: it works N ms (``anyio.sleep``, so that
the same code runs on Trio and on asyncio), then answers ``{"id": K}``, as
the route of the same name in ``examples/asgi_service.py`` does. Another,
``GET /cpu?ms=N``, spends N ms of the CPU (a busy loop on the thread's CPU
clock) before it answers, for the throughput of several worker processes.

The benchmarks serve it three ways:

* ``python bench/asgi_app.py --port 0 --grace 5``: trio_graceful's
  ``serve_asgi`` under ``trio_graceful.run`` (the example's ``serve``,
  with this app);
* ``hypercorn --worker-class trio --graceful-timeout 5 asgi_app:app``;
* ``uvicorn --timeout-graceful-shutdown 5 asgi_app:app``.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
import time

import anyio
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import trio_graceful
import trio_graceful.asgi


async def work(request: Request) -> Response:
    params = request.query_params
    ms = params.get("ms", "0")
    request_id = params.get("id", "0")
    if not (ms.isdigit() and request_id.isdigit()):
        return JSONResponse({"error": "ms and id must be whole numbers"}, 400)
    await anyio.sleep(int(ms) / 1000)
    return JSONResponse({"id": int(request_id)})


async def cpu(request: Request) -> Response:
    ms = request.query_params.get("ms", "1")
    if not ms.isdigit():
        return JSONResponse({"error": "ms must be a whole number"}, 400)
    end = time.thread_time() + int(ms) / 1000
    while time.thread_time() < end:
        pass
    # The process that answered, for the share of each worker.
    return JSONResponse({"ms": int(ms)}, headers={"x-pid": str(os.getpid())})


app = Starlette(routes=[Route("/work", work), Route("/cpu", cpu)])


async def serve(
    port: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    runner = trio_graceful.current_runner()
    server = await runner.start_service(
        functools.partial(trio_graceful.asgi.serve_asgi, bind=f"127.0.0.1:{port}"),
        app,
        name="http",
    )
    logging.getLogger("asgi_app").info("listening on %s", " ".join(server.urls))
    task_status.started()
    _, inbox = runner.root.open_inbox()
    await inbox.receive()  # STOP: return, and the server drains


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8000, help="the port (0: any)")
    trio_graceful.add_run_arguments(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    return trio_graceful.run(serve, args.port, **trio_graceful.run_arguments(args))


if __name__ == "__main__":
    sys.exit(main())
