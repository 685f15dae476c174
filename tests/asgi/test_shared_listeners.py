"""A listening socket inherited from the parent (``fd://N``), perhaps shared.

The workers of `trio_graceful.workers.serve_workers` all accept on one
socket. A server that took the whole queue each time it woke would take a
whole burst of connections, and keep them (keep-alive), while the others
idle; on an inherited socket, each wake-up takes one. Two servers in this
process share a socket here, as two workers do, in exact virtual time.
"""

from __future__ import annotations

import functools
import math
import os
import socket
from pathlib import Path

import trio
import trio.testing
from hypercorn.config import Config

import trio_graceful
from tests.support.asgi_app import Log, make_app
from trio_graceful.asgi import AsgiServer, serve_asgi
from trio_graceful.asgi._listeners import listen


async def test_servers_on_one_inherited_socket_share_a_burst_of_connections(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = tmp_path / "shared.sock"
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(str(path))
    listening.listen(64)
    app = make_app(Log())
    count = 10
    clients: list[socket.socket] = []
    with listening:
        async with trio_graceful.open_bundle(name="test") as bundle:
            servers: list[AsgiServer] = []
            for _ in range(2):
                _, inbox = bundle.open_inbox()
                # Each server adopts a descriptor of its own, and closes it.
                bind = f"fd://{os.dup(listening.fileno())}"
                servers.append(
                    await bundle.start(
                        functools.partial(serve_asgi, inbox, app, bind=bind)
                    )
                )
            # A burst: every connection is queued before either server runs.
            for _ in range(count):
                client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                client.connect(str(path))
                clients.append(client)
            await trio.testing.wait_all_tasks_blocked()
            accepted = [server.statistics().connections_total for server in servers]
            for client in clients:
                client.close()
            await bundle.shutdown(math.inf)
    assert sum(accepted) == count
    # Both woke for the burst and took turns: neither took it all.
    assert min(accepted) >= count // 2 - 1, accepted


async def test_only_inherited_sockets_are_shared(tmp_path: Path) -> None:
    # A socket the server binds itself is its own: each wake-up empties its
    # queue, so that a busy scheduler leaves no connection waiting.
    inherited = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    inherited.bind(str(tmp_path / "inherited.sock"))
    config = Config()
    config.bind = [f"unix:{tmp_path / 'own.sock'}", f"fd://{inherited.detach()}"]
    listeners, _, _ = listen(config)
    try:
        assert [listener.shared for listener in listeners] == [False, True]
    finally:
        for listener in listeners:
            listener.close()
