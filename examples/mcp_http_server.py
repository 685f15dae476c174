"""The MCP server of ``mcp_server.py``, over Streamable HTTP, stopping well.

The same ``MCPServer`` and tools (``sleep``, ``blocking_sleep``, ``echo``),
served at ``http://127.0.0.1:PORT/mcp`` by
`trio_graceful.mcp.streamable_http_app` on `trio_graceful.asgi.serve_asgi`
under `trio_graceful.run`. Run
``python examples/mcp_http_server.py --port 8000 [--grace S]
[--drain-delay S] [--health-port P]`` and connect the SDK's client
(``streamable_http_client("http://127.0.0.1:8000/mcp")``).

Try:

* SIGTERM (or Ctrl+C) during a ``sleep`` call: the call finishes and its
  answer arrives; a new ``tools/call`` in the session meanwhile is answered
  *server is shutting down; the request was not started*, a new session
  ``503``; the server exits with 0.
* ``--grace 2`` and a ``sleep`` of 30 s, then SIGTERM: just before 2 s the
  call is answered *... the call was cancelled before it finished*.
* ``blocking_sleep`` of 30 s, then SIGTERM: the thread sees its stop flag
  and the call answers ``"stopped"``.
* A second signal: the server exits at once.

Under the worker supervisor: ``python -m trio_graceful.asgi
mcp_http_server:app --app-dir examples --bind 127.0.0.1:8000`` (one worker:
a session lives in one process).
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from collections.abc import Sequence

import trio
from mcp_server import build_server

import trio_graceful
import trio_graceful.asgi
import trio_graceful.mcp

# At import, for python -m trio_graceful.asgi mcp_http_server:app too; the
# log first: the SDK configures logging when a server is made, if nobody has.
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
app = trio_graceful.mcp.streamable_http_app(build_server())


async def serve(
    port: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve the app as a service; return at STOP, when the service drains."""
    runner = trio_graceful.current_runner()
    server = await runner.start_service(
        functools.partial(trio_graceful.asgi.serve_asgi, bind=f"127.0.0.1:{port}"),
        app,
        name="mcp over http",
    )
    logging.getLogger("mcp_http_server").info("serving %s/mcp", server.urls[0])
    task_status.started()
    _, inbox = runner.root.open_inbox()
    await inbox.receive()  # STOP


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, serve until stopped, return the exit status."""
    parser = argparse.ArgumentParser(description="An MCP server over HTTP.")
    parser.add_argument("--port", type=int, default=8000, help="the port (0: any)")
    trio_graceful.add_run_arguments(parser, grace=10.0)
    args = parser.parse_args(argv)
    return trio_graceful.run(
        serve,
        args.port,
        exit_codes=trio_graceful.mcp.EXIT_CODES,
        name="mcp_http_server",
        **trio_graceful.run_arguments(args),
    )


if __name__ == "__main__":
    sys.exit(main())
