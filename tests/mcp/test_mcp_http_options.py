"""streamable_http_app's arguments, checked before anything is made."""

from __future__ import annotations

import pytest
from mcp.server.mcpserver import MCPServer

from trio_graceful.mcp import streamable_http_app


def test_the_server_must_be_an_sdk_server() -> None:
    with pytest.raises(
        TypeError,
        match=r"^server must be an mcp MCPServer or a low-level mcp Server, not 3$",
    ):
        streamable_http_app(3)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"retry_interval": -1}, ValueError, r"retry_interval must be >= 0, not -1"),
        (
            {"retry_interval": 0.0001},
            ValueError,
            r"retry_interval must be at least 0\.001 seconds, not 0\.0001",
        ),
        ({"retry_after": 0}, ValueError, r"retry_after must be >= 1, not 0"),
        (
            {"retry_interval": "1"},
            TypeError,
            r"retry_interval must be a number of seconds, not str '1'",
        ),
    ],
)
def test_bad_options_are_refused(
    options: dict[str, object], error: type[Exception], message: str
) -> None:
    server = MCPServer("options")
    with pytest.raises(error, match=f"^{message}$"):
        streamable_http_app(server, **options)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    with pytest.raises(RuntimeError):  # nothing was made
        _ = server.session_manager


def test_the_options_reach_the_sdk() -> None:
    server = MCPServer("options")
    streamable_http_app(server, retry_interval=0.5)
    assert server.session_manager.retry_interval == 500  # milliseconds
