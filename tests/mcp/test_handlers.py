"""HandlersInBundle: a request whose handler would start after its bundle closed."""

from __future__ import annotations

from typing import Any, cast

import pytest
from mcp.server.context import ServerRequestContext
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError

import trio_graceful
from trio_graceful.mcp._handlers import HandlersInBundle


async def test_a_request_is_refused_once_its_bundle_has_closed() -> None:
    async with trio_graceful.open_bundle(name="MCP calls") as calls:
        pass  # closed: no child, nothing to wait for
    assert calls.closed
    started: list[str] = []

    async def handler(ctx: ServerRequestContext[Any, Any]) -> None:
        started.append(ctx.method)

    ctx = ServerRequestContext[Any, Any](
        session=cast("ServerSession", None),  # not read before the check
        lifespan_context=None,
        protocol_version="2025-11-25",
        method="tools/call",
        params={"name": "sleep", "arguments": {"seconds": 1}},
        request_id=7,
    )
    with pytest.raises(MCPError) as raised:
        await HandlersInBundle(calls)(ctx, handler)
    assert (raised.value.error.code, raised.value.error.message) == (
        -32000,
        "server is shutting down; the request was not started",
    )
    assert started == []
