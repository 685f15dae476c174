"""One replica of an MCP server over Streamable HTTP, its event store shared.

``python -m tests.support.mcp_replica STORE_URL`` serves an ``MCPServer``
with `trio_graceful.mcp.streamable_http_app` (``event_store=...``) and
`trio_graceful.asgi.serve_asgi` under `trio_graceful.run`, on a free port of
127.0.0.1, and logs ``listening on http://127.0.0.1:PORT``. Its tool
``announce(start, stop, close_first=False)`` tells that the resources
``announcement://<n>`` changed, for n in ``range(start, stop)``: these
notifications belong to no request, so the SDK stores them and sends them on
the session's standalone GET stream, the one a client resumes with
``Last-Event-ID``. With ``close_first``, it ends that stream first (as a
server that stops does): the notifications are stored, not sent.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Awaitable, Callable

import trio
from mcp.server.mcpserver import Context, MCPServer

import trio_graceful
from trio_graceful.asgi import serve_asgi
from trio_graceful.mcp import SharedEventStore, open_event_store, streamable_http_app

RETRY_MS = 500


def build_app(store: SharedEventStore) -> Callable[..., Awaitable[None]]:
    server = MCPServer("replica")

    @server.tool()
    async def announce(  # pyright: ignore[reportUnusedFunction]
        start: int, stop: int, ctx: Context, close_first: bool = False
    ) -> str:
        if close_first:
            await ctx.close_standalone_sse_stream()
        for n in range(start, stop):
            await ctx.session.send_resource_updated(f"announcement://{n}")
        return f"announced {stop - start}"

    return streamable_http_app(
        server, event_store=store, retry_interval=RETRY_MS / 1000
    )


async def main(url: str) -> None:
    _, inbox = trio_graceful.current_runner().root.open_inbox()
    # The store outlives the server: it closes once every request has ended.
    async with open_event_store(url) as store, trio.open_nursery() as nursery:
        server = await nursery.start(
            functools.partial(serve_asgi, inbox, build_app(store), bind="127.0.0.1:0")
        )
        logging.getLogger("mcp_replica").info("listening on %s", server.urls[0])


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    sys.exit(trio_graceful.run(main, sys.argv[1]))
