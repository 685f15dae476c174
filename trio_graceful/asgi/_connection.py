"""One TCP connection of the ASGI server: reading, writing, draining, closing.

This stands where Hypercorn's ``TCPServer`` does, and differs from it where
a drain needs it to:

* **Reading.** Between requests the reader waits with the keep-alive
  timeout. From STOP on, an idle HTTP/1.1 connection waits for its client's
  next request until `DRAIN_KEEP_ALIVE` seconds after its last response (or
  its accept): a client that got a response without ``Connection: close``,
  or that has just connected, may be sending a request already, and it is
  answered, with ``Connection: close``. Past that, or at once for HTTP/2
  (its GOAWAY told the client) and when that wait would reach the cut-off,
  an idle connection with no request in its socket closes. A busy one
  closes when its last response has gone out (the protocol decides which
  response that is, `_protocols`). Only the wait for data is ever
  cancelled, never the parsing of what was read. With Hypercorn's
  ``read_timeout``, a connection from which nothing arrives for that long
  is closed, whatever it is doing, as in Hypercorn's Trio worker.
* **Writing** goes through the socket's own ``send``, which sends nothing
  when it is cancelled, and keeps exactly what was not sent: a request task
  cut off in the middle of a write leaves the stream consistent, so its
  response can still be ended properly. Nothing is shielded: the hard
  deadline, and a second signal, stop a write to a client that reads
  nothing.
* **Closing** is a FIN, never a reset: everything queued is sent, the write
  side is shut, and what the client still sends is read and dropped until it
  closes too (at most `LINGER` seconds, never past the cut-off), and what is
  left unread then is dropped too, so that the kernel has no unread data that
  would turn the close into an RST.
"""

from __future__ import annotations

import contextlib
import errno
import math
import socket
from typing import cast, final

import trio
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.typing import ConnectionState, TaskGroup

from .._core._log import library_logger
from .._core._openbundle import open_bundle
from ._protocols import ServerProtocol
from ._requests import AppTasks
from ._serverstate import ServerState

logger = library_logger("trio_graceful.asgi")

MAX_RECV = 2**16
# Seconds a closed connection waits for the client's own FIN.
LINGER = 1.0
# Seconds after its last response (or its accept) that an idle HTTP/1.1
# connection waits for the client's next request during a drain, if that
# wait ends before the cut-off.
DRAIN_KEEP_ALIVE = 1.0
_NOTHING_YET = (errno.EAGAIN, errno.EWOULDBLOCK)
# At most this many reads of MAX_RECV are dropped before a close.
_DISCARD_READS = 16


@final
class Connection:
    """One accepted connection; `serve` runs it to its end."""

    def __init__(
        self,
        state: ServerState,
        stream: trio.SocketStream | trio.SSLStream[trio.SocketStream],
    ) -> None:
        self._state = state
        self._stream = stream
        self._tls = isinstance(stream, trio.SSLStream)
        transport = (
            stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
        )
        self._socket = transport.socket
        address = _host_and_port(self._socket.getpeername())
        self.name = "connection" if address is None else "{}:{}".format(*address)
        """The client's address, as the connection's task is named."""
        self._protocol: ServerProtocol | None = None
        # Bytes the protocol has written: queued, then the part of the
        # current send that has not gone out yet.
        self._queued: list[bytes] = []
        self._unsent = memoryview(b"")
        self._send_lock = trio.Lock()
        self._closing = False
        self._peer_closed = False
        self._fin_sent = False
        self._cut_off = False
        # Whether the protocol was told of STOP.
        self._told = False
        self._reader = trio.CancelScope()
        # The scope of the reader's current wait for data.
        self._wait = trio.CancelScope()
        self._keep_alive = float(state.config.keep_alive_timeout)
        self._read_timeout = float(state.config.read_timeout or math.inf)
        # When the last response ended; accepted, the client's first
        # request is on its way.
        self._idle_since = trio.current_time()
        self._tasks: AppTasks | None = None

    # -- what the protocol and the request tasks ask -------------------------

    @property
    def draining(self) -> bool:
        """True once the server got STOP."""
        return self._state.drain.stopped.is_set()

    @property
    def cut_off(self) -> bool:
        """True once this connection's requests have been cut off."""
        return self._cut_off

    @property
    def hard_deadline(self) -> float:
        """The server's hard deadline; `math.inf` before STOP."""
        return self._state.drain.deadline

    def peek(self) -> bytes:
        """Return what the socket holds unread (nothing for TLS). Not a checkpoint."""
        if self._tls:
            return b""
        data = self._peek()
        return b"" if data is None else data

    def request_cut(self, name: str, what: str) -> None:
        """Record a request that was cut off; ``what`` says how it ended."""
        self._state.request_cut(name, what)

    @property
    def requests(self) -> frozenset[trio.lowlevel.Task]:
        """The tasks of the requests running on this connection."""
        return frozenset() if self._tasks is None else self._tasks.running

    def abort(self) -> None:
        """Close without ending the response in progress."""
        self._queued.clear()
        self._unsent = memoryview(b"")
        self._begin_close()

    # -- what the server asks --------------------------------------------------

    def stop(self) -> None:
        """STOP: close once idle, or after the last response. Not a checkpoint."""
        self._wake()

    async def cut(self) -> None:
        """The cut-off: cancel the running requests, which end their responses.

        Returns when they have ended. The connection itself goes on, to send
        what they wrote and close. This is a checkpoint.
        """
        self._cut_off = True
        if self._tasks is None:
            await trio.lowlevel.checkpoint()
        else:
            await self._tasks.cut()

    # -- running ---------------------------------------------------------------

    async def serve(self) -> None:
        """Serve the connection until it closes. This is a checkpoint.

        Its errors are logged, never raised: one connection does not end
        the server.
        """
        try:
            if await self._handshake():
                async with trio.open_nursery() as helpers:
                    await self._serve(helpers)
                    helpers.cancel_scope.cancel()  # HTTP/2's sender, pings
        except Exception:
            logger.exception("connection from %s failed", self.name)
        finally:
            if not self._peer_closed and self._socket.fileno() != -1:
                self._discard_unread()
            await trio.aclose_forcefully(self._stream)
            self._state.connection_ended(self)

    async def _serve(self, helpers: trio.Nursery) -> None:
        async with open_bundle(name="requests") as apps:
            self._tasks = AppTasks(apps, helpers, self)
            self._protocol = protocol = self._open_protocol(self._tasks)
            await protocol.initiate()
            if self.draining:
                self._told = True
                await protocol.begin_drain()
            with self._reader:
                await self._read()
            self._closing = True
            await protocol.handle(Closed())
            await self._close_transport()

    async def _handshake(self) -> bool:
        stream = self._stream
        if not isinstance(stream, trio.SSLStream):
            return True
        try:
            with trio.fail_after(self._state.config.ssl_handshake_timeout):
                await stream.do_handshake()
        except (trio.BrokenResourceError, trio.TooSlowError):
            return False
        return True

    def _open_protocol(self, tasks: AppTasks) -> ServerProtocol:
        state = self._state
        sock = self._socket
        if isinstance(self._stream, trio.SSLStream):
            alpn = self._stream.selected_alpn_protocol()
        else:
            alpn = "http/1.1"
        return ServerProtocol(
            state.app,
            state.config,
            state.context,
            # Hypercorn's TaskGroup protocol asks for an async context
            # manager too, which its protocols never use.
            cast("TaskGroup", tasks),
            ConnectionState(state.lifespan_state.copy()),
            tls=self._tls,
            client=_host_and_port(sock.getpeername()),
            server=_host_and_port(sock.getsockname()),
            send=self._on_event,
            drain=self,
            alpn_protocol=alpn,
        )

    async def _read(self) -> None:
        protocol = self._protocol
        assert protocol is not None
        while not self._closing:
            if self.draining and not self._told:
                self._told = True  # HTTP/2 sends its GOAWAY
                await protocol.begin_drain()
            deadline = self._read_deadline()
            if protocol.idle and trio.current_time() >= deadline:
                # The keep-alive timeout, or idle during a drain: closed,
                # unless a request is already on its way, which is read.
                if await self._fin_if_idle():
                    return
                deadline = math.inf
            try:
                data = await self._wait_for_data(deadline)
            except trio.TooSlowError:
                return  # the read timeout: closed, as Hypercorn does
            if data is None:
                continue  # woken, or the deadline came: look again
            if not data:
                self._peer_closed = True
                await protocol.handle(RawData(data=b""))
                return
            await protocol.handle(RawData(data=data))

    def _read_deadline(self) -> float:
        """When the reader gives up waiting for a request: never while one is open.

        Idle, the keep-alive timeout; during a drain, `DRAIN_KEEP_ALIVE`
        after the last response (HTTP/1.1), or at once: for HTTP/2, whose
        GOAWAY told the client, and when that wait would reach the cut-off,
        where a request would be cut off before it could be answered.
        """
        protocol = self._protocol
        assert protocol is not None
        if not protocol.idle:
            return math.inf
        if not self.draining:
            return self._idle_since + self._keep_alive
        held = self._idle_since + DRAIN_KEEP_ALIVE
        if protocol.announces_close or held >= self._state.drain.cutoff:
            return -math.inf
        return held

    async def _wait_for_data(self, deadline: float) -> bytes | None:
        """Read what comes before ``deadline``; None if it came first, or a wake-up.

        Only the wait for data is cancelled, never what follows a read: bytes
        taken from the socket always reach the protocol. (A scope that also
        held ``protocol.handle`` could be cancelled between the read and the
        request it brings, leaving the requests pipelined behind it unparsed
        in h11's buffer, where no look at the socket sees them.) This is a
        checkpoint.

        Raises:
            trio.TooSlowError: if nothing came within Hypercorn's
                ``read_timeout``.
        """
        with trio.CancelScope(deadline=deadline) as self._wait:
            return await self._receive()
        return None

    async def _receive(self) -> bytes:
        try:
            with trio.fail_after(self._read_timeout):
                return bytes(await self._stream.receive_some(MAX_RECV))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""  # reset by the client: as good as closed

    async def _fin_if_idle(self) -> bool:
        """Send the FIN of an idle connection unless a request is on its way.

        Called at its keep-alive timeout, or during a drain. The last look
        at the socket and the FIN are one step, with no checkpoint between
        them: a request that arrives after it was sent after the FIN, and
        the client knows that it was not received. Returns whether the FIN
        went out (for TLS, whether the connection may close). This is a
        checkpoint if an answer is still being sent.
        """
        while self._queued or self._unsent:  # the last answer is still going out
            async with self._send_lock:
                await self._flush()
        if self._peek() is not None:
            return False
        if not self._tls and not self._peer_closed:
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_WR)
            self._fin_sent = True
        return True

    def _peek(self) -> bytes | None:
        """Return the socket's unread bytes (b"" at EOF), or None if there are none."""
        with self._duplicate() as dup:
            try:
                return dup.recv(MAX_RECV, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except OSError as exc:
                if exc.errno in _NOTHING_YET:
                    return None
                return b""  # reset: the reader will find out

    def _discard_unread(self) -> None:
        """Drop what the socket holds unread: closing it then sends no reset."""
        with self._duplicate() as dup, contextlib.suppress(OSError):
            for _ in range(_DISCARD_READS):
                if not dup.recv(MAX_RECV, socket.MSG_DONTWAIT):
                    return

    def _duplicate(self) -> socket.socket:
        # A duplicate of the descriptor reads the same socket without
        # blocking, and without Trio's wait for readiness.
        sock = self._socket
        return socket.fromfd(sock.fileno(), sock.family, socket.SOCK_STREAM)

    def _wake(self) -> None:
        """Make the reader look at the connection again, if it waits for data."""
        self._wait.cancel()

    def _begin_close(self) -> None:
        self._closing = True
        self._reader.cancel()

    async def _on_event(self, event: Event) -> None:
        if isinstance(event, RawData):
            await self._write(event.data)
        elif isinstance(event, Closed):
            self._begin_close()
        elif isinstance(event, Updated):
            if event.idle:
                self._idle_since = trio.current_time()
            self._wait.deadline = self._read_deadline()

    # -- writing and closing ---------------------------------------------------------

    async def _write(self, data: bytes) -> None:
        if self._closing and self._peer_closed:
            return  # nobody to send it to
        self._queued.append(data)
        async with self._send_lock:
            await self._flush()

    async def _flush(self) -> None:
        """Send what is queued; the caller holds the send lock. A checkpoint."""
        try:
            if self._tls:
                while self._queued:
                    data = b"".join(self._queued)
                    self._queued.clear()
                    await self._stream.send_all(data)
                return
            send = self._socket.send
            while True:
                if not self._unsent:
                    if not self._queued:
                        return
                    self._unsent = memoryview(b"".join(self._queued))
                    self._queued.clear()
                # Cancelled, it sends nothing: _unsent stays exact.
                sent = await send(self._unsent)
                self._unsent = self._unsent[sent:]
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            self._peer_closed = True
            self.abort()

    async def _close_transport(self) -> None:
        """Send what is left, then FIN, then wait a little for the client's FIN.

        The wait ends at `LINGER` seconds, or at the cut-off if that comes
        first; a client that has not closed by then may see a reset.
        """
        stream = self._stream
        try:
            async with self._send_lock:
                await self._flush()
            if self._peer_closed or not isinstance(stream, trio.SocketStream):
                return
            if not self._fin_sent:
                await stream.send_eof()
            # Never past the cut-off: the rest of the time is for the
            # requests cut off and the lifespan's shutdown.
            with trio.move_on_at(
                min(trio.current_time() + LINGER, self._state.drain.cutoff)
            ):
                while await stream.receive_some(MAX_RECV):
                    pass
                self._peer_closed = True
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass


def _host_and_port(name: object) -> tuple[str, int] | None:
    """A socket's address as ASGI wants it: ``(host, port)``, None for Unix sockets."""
    if isinstance(name, tuple):
        host, port = cast("tuple[str, int]", name)[:2]
        return host, port
    return None
