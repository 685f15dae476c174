"""The example's MCP server over HTTP, with its events kept in memory.

``python tests/support/mcp_http_resumable.py --port P [run options]``: the
tools of ``examples/mcp_server.py`` served by
`trio_graceful.mcp.streamable_http_app` with `ListEventStore`, a test double
of the SDK's ``EventStore`` interface, so that a client can resume a stream
with ``Last-Event-ID``.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import trio
from mcp.server.streamable_http import (
    EventCallback,
    EventId,
    EventMessage,
    EventStore,
    StreamId,
)
from mcp_types import JSONRPCMessage

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from mcp_server import build_server

import trio_graceful
import trio_graceful.asgi
import trio_graceful.mcp


class ListEventStore(EventStore):
    """Every event in a list, its id its place in it (from 1)."""

    def __init__(self) -> None:
        self.events: list[tuple[StreamId, JSONRPCMessage | None]] = []

    async def store_event(
        self, stream_id: StreamId, message: JSONRPCMessage | None
    ) -> EventId:
        self.events.append((stream_id, message))
        return str(len(self.events))

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        if not last_event_id.isdigit() or not 0 < int(last_event_id) <= len(
            self.events
        ):
            return None
        after = int(last_event_id)
        stream_id = self.events[after - 1][0]
        for number, (stream, message) in enumerate(self.events[after:], after + 1):
            if stream == stream_id and message is not None:
                await send_callback(EventMessage(message, str(number)))
        return stream_id


async def serve(
    port: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    runner = trio_graceful.current_runner()
    app = trio_graceful.mcp.streamable_http_app(
        build_server(), event_store=ListEventStore()
    )
    server = await runner.start_service(
        functools.partial(trio_graceful.asgi.serve_asgi, bind=f"127.0.0.1:{port}"),
        app,
    )
    print(f"serving {server.urls[0]}/mcp", file=sys.stderr, flush=True)
    task_status.started()
    _, inbox = runner.root.open_inbox()
    await inbox.receive()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    trio_graceful.add_run_arguments(parser)
    args = parser.parse_args()
    return trio_graceful.run(
        serve,
        args.port,
        exit_codes=trio_graceful.mcp.EXIT_CODES,
        **trio_graceful.run_arguments(args),
    )


if __name__ == "__main__":
    sys.exit(main())
