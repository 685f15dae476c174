"""The server's listening sockets, and the loops that accept their connections."""

from __future__ import annotations

import socket
import traceback
from typing import Final, cast

import trio
from hypercorn.config import Config, Sockets

from .._core._bundle import Bundle
from .._core._log import library_logger
from ._connection import Connection
from ._core import ServerCore

logger = library_logger("trio_graceful.asgi")

Listener = trio.SocketListener | trio.SSLListener[trio.SocketStream]


def _create_sockets(config: Config) -> Sockets:
    """Hypercorn's ``create_sockets``, closing what it leaves open when a bind fails.

    Raises:
        OSError: if an address cannot be bound; unlike Hypercorn's, its
            message names the address (``[Errno 98] cannot listen on
            127.0.0.1:8000: Address already in use``).
    """
    try:
        return config.create_sockets()
    except OSError as exc:
        # Hypercorn keeps the socket that failed, and those made before it,
        # in its locals only: close them, or they stay open until collected.
        # The address it was binding is there too.
        where: object = None
        for frame, _ in traceback.walk_tb(exc.__traceback__):
            local = frame.f_locals
            if frame.f_code is _BINDING:
                where = local.get("bind")
            for name in ("sock", "sockets", "secure_sockets", "insecure_sockets"):
                value: object = local.get(name)
                found = (
                    cast("list[object]", value) if isinstance(value, list) else [value]
                )
                for sock in found:
                    if isinstance(sock, socket.socket):
                        sock.close()
        if not isinstance(where, str) or exc.strerror is None:
            raise
        # OSError(errno, text) is the subclass of the errno (PermissionError...).
        raise OSError(exc.errno, f"cannot listen on {where}: {exc.strerror}") from exc


# The code of Hypercorn's loop that binds each address.
_BINDING: Final = Config._create_sockets.__code__  # pyright: ignore[reportPrivateUsage]


def listen(config: Config) -> tuple[list[Listener], list[str], list[tuple[str, int]]]:
    """Bind and listen as ``config`` says; return the listeners, URLs and addresses.

    Raises:
        OSError: if an address cannot be bound (nothing is left open).
    """
    sockets = _create_sockets(config)
    ssl_context = config.create_ssl_context()
    listeners: list[Listener] = []
    urls: list[str] = []
    addresses: list[tuple[str, int]] = []
    for scheme, group in (
        ("https", sockets.secure_sockets),
        ("http", sockets.insecure_sockets),
    ):
        for sock in group:
            sock.listen(config.backlog)
            listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
            url, address = _where(sock)
            urls.append(f"{scheme}://{url}")
            if address is not None:
                addresses.append(address)
            listeners.append(
                trio.SSLListener(listener, ssl_context, https_compatible=True)
                if scheme == "https" and ssl_context is not None
                else listener
            )
    for url in urls:
        logger.info("serving on %s", url)
    return listeners, urls, addresses


def _where(sock: socket.socket) -> tuple[str, tuple[str, int] | None]:
    """Return how a listening socket's address is written, and its (host, port)."""
    name: object = sock.getsockname()
    if sock.family == socket.AF_UNIX:
        return f"unix:{name}", None
    host, port = cast("tuple[str, int]", name)[:2]
    return (
        f"[{host}]:{port}" if sock.family == socket.AF_INET6 else f"{host}:{port}"
    ), (
        host,
        port,
    )


async def accept(listener: Listener, connections: Bundle, core: ServerCore) -> None:
    """Serve each connection ``listener`` accepts as a child of ``connections``.

    Returns when the listener is closed. This is a checkpoint.
    """
    while True:
        try:
            stream = await listener.accept()
        except trio.ClosedResourceError:
            return  # closed at STOP
        except OSError as exc:
            # Out of file descriptors, say: trio.serve_listeners' answer.
            logger.error("accept failed, trying again in 0.1 s: %s", exc)
            await trio.sleep(0.1)
            continue
        connection = Connection(core, stream)
        core.connection_started(connection)
        connections.start_soon(connection.serve, name=connection.name)
