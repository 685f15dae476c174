"""What `streamable_http_app` needs of the SDK's privates (``mcp`` 2.3.0), in
the one place that reaches into them (`trio_graceful.mcp._http._SdkSessions`).

If an SDK release renames or reshapes them, these fail, rather than a server
that mixes sessions' events or cannot end its sessions at a second signal.
"""

from __future__ import annotations

import pytest
from mcp.server.mcpserver import MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from tests.support.mcp_http_resumable import ListEventStore
from trio_graceful.mcp import streamable_http_app
from trio_graceful.mcp._http import (
    _SdkSessions,  # pyright: ignore[reportPrivateUsage]
)
from trio_graceful.mcp._sessionevents import SessionEvents


def sessions(
    store: ListEventStore | None,
) -> tuple[StreamableHTTPSessionManager, _SdkSessions]:
    server = MCPServer("privates")
    streamable_http_app(server, event_store=store)
    manager = server.session_manager
    return manager, _SdkSessions(manager, None)


def test_each_session_the_sdk_admits_stores_through_its_own_view() -> None:
    store = ListEventStore()
    manager, listed = sessions(store)
    one = manager._admit_session(None)  # pyright: ignore[reportPrivateUsage]
    two = manager._admit_session(None)  # pyright: ignore[reportPrivateUsage]
    assert one is not None
    assert two is not None
    assert listed.transports() == [one, two]
    for transport in (one, two):
        view = transport._event_store  # pyright: ignore[reportPrivateUsage]
        assert isinstance(view, SessionEvents)
        assert (view.store, view.session_id) == (store, transport.mcp_session_id)


def test_without_a_store_the_sessions_have_none() -> None:
    manager, listed = sessions(None)
    transport = manager._admit_session(None)  # pyright: ignore[reportPrivateUsage]
    assert transport is not None
    assert transport._event_store is None  # pyright: ignore[reportPrivateUsage]
    assert listed.transports() == [transport]


def test_a_session_made_otherwise_than_expected_is_refused() -> None:
    manager, _ = sessions(ListEventStore())
    manager.event_store = ListEventStore()  # not the store the view was made for
    with pytest.raises(RuntimeError, match="cannot be kept apart"):
        manager._admit_session(None)  # pyright: ignore[reportPrivateUsage]
