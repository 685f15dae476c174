"""The server's listening sockets, and the loops that accept their connections.

They listen with a long queue (`backlog`). A socket that came from the
server's parent (an ``fd://N`` bind: socket activation, or the sockets
`trio_graceful.workers.serve_workers` hands its workers) may be *shared*
with other processes, and its loop takes one connection per wake-up,
leaving the rest of the queue to them (see `accept`). At STOP they close
(`stop_listening`). A connection the kernel has already accepted, but the
server not yet, waits in its listening socket's queue: its handshake is done
and its client may have written a request. Closing the socket would reset
it, so the queue is emptied first, in the same step as the close, and those
connections are served like the others during the drain: a request that
comes is answered with ``Connection: close``.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import traceback
from collections.abc import Sequence
from typing import Final, cast, final

import trio
from hypercorn.config import Config, Sockets

from .._core._bundle import Bundle
from .._core._log import library_logger
from ._connection import Connection
from ._serverstate import ServerState

logger = library_logger("trio_graceful.asgi")

Stream = trio.SocketStream | trio.SSLStream[trio.SocketStream]


@final
class Listener:
    """One listening socket, and the TLS of the connections it accepts."""

    def __init__(
        self,
        sock: socket.socket,
        ssl_context: ssl.SSLContext | None,
        *,
        shared: bool = False,
    ) -> None:
        self._listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        self._ssl_context = ssl_context
        # Inherited, so perhaps served by other processes too.
        self.shared = shared

    async def accept(self) -> Stream:
        """Wait for the next connection (as `trio.SocketListener.accept`).

        This is a checkpoint.

        Raises:
            trio.ClosedResourceError: if the listener was closed.
            OSError: if the system refuses (out of file descriptors...).
        """
        return self._wrap(await self._listener.accept())

    def accept_queued(self) -> list[Stream]:
        """Accept the connections waiting in the queue, without waiting.

        Not a checkpoint.
        """
        listening = self._listener.socket
        streams: list[Stream] = []
        # A duplicate of the descriptor accepts without Trio's wait for
        # readiness; BlockingIOError ends it: the queue is empty.
        try:
            dup = socket.fromfd(listening.fileno(), listening.family, listening.type)
        except OSError:
            # Closed at STOP as the last accept returned, or out of file
            # descriptors (the next accept says so).
            return streams
        with dup, contextlib.suppress(OSError):
            dup.setblocking(False)
            while True:
                sock, _ = dup.accept()
                stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
                streams.append(self._wrap(stream))
        return streams

    def close(self) -> None:
        """Close the socket: an `accept` under way raises. Not a checkpoint."""
        self._listener.socket.close()

    def _wrap(self, stream: trio.SocketStream) -> Stream:
        if self._ssl_context is None:
            return stream
        return trio.SSLStream(
            stream, self._ssl_context, server_side=True, https_compatible=True
        )


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
    inherited = {
        int(bind[len("fd://") :])
        for bind in (*config.bind, *config.insecure_bind)
        if bind.startswith("fd://")
    }
    listeners: list[Listener] = []
    urls: list[str] = []
    addresses: list[tuple[str, int]] = []
    for scheme, group in (
        ("https", sockets.secure_sockets),
        ("http", sockets.insecure_sockets),
    ):
        for sock in group:
            sock.listen(backlog(config))
            url, address = _where(sock)
            urls.append(f"{scheme}://{url}")
            if address is not None:
                addresses.append(address)
            listeners.append(
                Listener(
                    sock,
                    ssl_context if scheme == "https" else None,
                    shared=sock.fileno() in inherited,
                )
            )
    for url in urls:
        logger.info("serving on %s", url)
    return listeners, urls, addresses


def backlog(config: Config) -> int:
    """The length of the listeners' queues: the config's, or the system's largest.

    Hypercorn's default of 100 overflows in a burst of connections to a busy
    server: the kernel then leaves the connections beyond it half-open (the
    client believes its connection open and writes its request, which the
    server never got), and closing the listener at STOP resets them. A
    ``backlog`` set in the config is kept as it is.
    """
    if "backlog" in vars(config):
        return int(config.backlog)
    return max(int(config.backlog), socket.SOMAXCONN)


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


async def accept(listener: Listener, connections: Bundle, state: ServerState) -> None:
    """Serve each connection ``listener`` accepts as a child of ``connections``.

    Each time it wakes, it accepts every connection in the queue, unless the
    listener is shared: then one, and the others stay queued for the other
    processes. Returns when the listener is closed. This is a checkpoint.
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
        _serve(stream, connections, state)
        if listener.shared:
            # The process that wakes first, or is running already, would
            # take a whole burst and keep it (keep-alive) while the others
            # idle. One per turn: a busy process's turn is long, an idle
            # one wakes and takes the rest.
            continue
        # And the rest of the queue, as asyncio's loop does: one accept per
        # turn of a busy scheduler would leave connections queued, their
        # requests unread, for as many turns.
        for queued in listener.accept_queued():
            _serve(queued, connections, state)


def stop_listening(
    listeners: Sequence[Listener], connections: Bundle, state: ServerState
) -> int:
    """Close the listeners; serve the connections still in their queues.

    Each queue is emptied and its socket closed with no checkpoint between:
    only a handshake that ends within that step can still be reset. Returns
    how many connections were taken from the queues. Not a checkpoint.
    """
    queued: list[Stream] = []
    for listener in listeners:
        queued += listener.accept_queued()
        listener.close()
    for stream in queued:
        _serve(stream, connections, state)
    return len(queued)


def _serve(stream: Stream, connections: Bundle, state: ServerState) -> None:
    connection = Connection(state, stream)
    state.connection_started(connection)
    connections.start_soon(connection.serve, name=connection.name)
