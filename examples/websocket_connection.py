"""One server-side WebSocket connection on a Trio stream.

The protocol is the sans-io core of the ``websockets`` library
(`websockets.server.ServerProtocol`): it parses frames, answers PING and the
client's CLOSE, and checks sizes; this module moves its bytes over a
`trio.SocketStream` and assembles messages. The server that uses it keeps
full control over *when* it reads: `WebSocket.receive` reads once and hands
over every message that read brought in, and a cancelled call has read
nothing, so a server always knows exactly which requests it has read.
(trio-websocket reads in a task of its own and queues what it read, out of
the server's sight.)

Part of ``examples/websocket_close_server.py``; see that file.
"""

from __future__ import annotations

import codecs
import select
from collections.abc import Callable

import attrs
import trio
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import Event, State
from websockets.server import ServerProtocol

RECEIVE_SIZE = 65536
"""Bytes asked of the socket per read."""

HIGH_WATER = 65536
"""Bytes queued for sending beyond which `WebSocket.send` waits."""

ABNORMAL = 1006
"""The code reported for a connection that ended without a close handshake."""

Message = str | bytes
"""A complete text (str) or binary (bytes) message."""


class _ServerProtocol(ServerProtocol):
    """`ServerProtocol` that takes a CLOSE between the fragments of a message.

    RFC 6455 (section 5.4) lets control frames come between the fragments of
    a message; ``websockets`` fails the connection (1002) when that control
    frame is a CLOSE. Here the CLOSE is answered as any other, and the
    unfinished message ends with the connection.
    """

    def recv_frame(self, frame: Frame) -> None:
        if frame.opcode is Opcode.CLOSE:
            self.current_size = None  # no message in progress any more
        super().recv_frame(frame)


class ConnectionClosed(Exception):
    """The connection is closed, or closing: no message can be sent or received."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"connection closed: {code} {reason}".rstrip())
        self.code = code
        self.reason = reason


@attrs.define(eq=False)
class WebSocket:
    """An open WebSocket connection. Made by `accept_websocket`.

    One task reads (`receive`, `aclose`); any task may send.
    """

    stream: trio.SocketStream
    _protocol: ServerProtocol
    _send_lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    _binary: list[bytes] = attrs.field(factory=list[bytes], init=False)
    _chars: list[str] = attrs.field(factory=list[str], init=False)
    _text: codecs.IncrementalDecoder | None = attrs.field(default=None, init=False)
    _early: list[Message] = attrs.field(factory=list[Message], init=False)
    _out: bytearray = attrs.field(factory=bytearray, init=False)
    _eof_due: bool = attrs.field(default=False, init=False)

    @classmethod
    async def accept(
        cls, stream: trio.SocketStream, *, max_message: int
    ) -> WebSocket | None:
        """Read the opening handshake from ``stream`` and accept it.

        Returns the open `WebSocket`, or None if the client sent something
        else (it got an HTTP error response) or left. Cancelling it loses
        nothing that matters: no message has been read. This is a checkpoint.
        """
        protocol = _ServerProtocol(max_size=max_message)
        ws = cls(stream, protocol)
        while True:
            data = await ws.read_some()
            if not data:
                return None
            protocol.receive_data(data)
            events = protocol.events_received()
            for event in events:
                if isinstance(event, Request):
                    protocol.send_response(protocol.accept(event))
            # frames sent right behind the handshake, in the same read
            ws._take_all(events, ws._early.append)
            await ws.flush()
            if protocol.state is State.OPEN:
                return ws
            if protocol.close_expected() or protocol.state is State.CLOSED:
                return None

    def __str__(self) -> str:
        host, port = self.stream.socket.getpeername()[:2]
        return f"ws<{host}:{port}>"

    async def read_some(self) -> bytes:
        try:
            return await self.stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""

    def readable_now(self) -> bool:
        """Tell, without waiting, whether the client has sent something unread."""
        if self._early:
            return True
        poller = select.poll()  # not select.select: descriptors may pass 1023
        poller.register(self.stream.socket.fileno(), select.POLLIN)
        return bool(poller.poll(0))

    async def receive(self) -> list[Message]:
        """Read once; return the complete messages that read brought in.

        Often returns several messages, sometimes none (a PING, or a part of
        a frame). Cancel-safe: a cancelled call has read nothing, or, once
        the connection is closing, returned nothing. Replies of the protocol
        (PONG, and CLOSE until the call that raises) go out with the next
        `send` or `flush`.

        Raises:
            ConnectionClosed: if the client closed (its CLOSE is answered),
                the connection was lost, or the client broke the protocol (it
                was failed with the code RFC 6455 asks for: 1002, 1007, 1009).
                The messages that came before, in the same read, are
                returned first, and the next call raises.
        """
        if self._early:
            await trio.lowlevel.checkpoint()
            early, self._early = self._early, []
            return early
        protocol = self._protocol
        if protocol.state is State.OPEN:
            data = await self.read_some()
            if data:
                protocol.receive_data(data)
            else:
                protocol.receive_eof()
            messages: list[Message] = []
            self._take_all(protocol.events_received(), messages.append)
            if messages:  # also if it closed: the next call raises
                return messages
        if protocol.state is not State.OPEN:
            await self.flush()  # the CLOSE in answer
            raise self._closed()
        return []

    def _take_all(
        self, events: list[Event], deliver: Callable[[Message], None]
    ) -> None:
        """Assemble the messages of the frames in ``events``, in order.

        Also those before the client's CLOSE or before a frame that broke the
        protocol: they were read. Invalid UTF-8 fails the connection (1007),
        and nothing after it is taken.
        """
        try:
            for event in events:
                if isinstance(event, Frame):
                    self._take(event, deliver)
        except UnicodeDecodeError:
            self._protocol.fail(1007, "invalid UTF-8 in a text message")

    def _take(self, frame: Frame, deliver: Callable[[Message], None]) -> None:
        opcode, data = frame.opcode, frame.data
        if opcode is Opcode.TEXT:
            if frame.fin:  # the common case: a message in one frame
                deliver(bytes(data).decode())
                return
            self._text = codecs.getincrementaldecoder("utf-8")()
        elif opcode is Opcode.BINARY:
            self._text = None
            if frame.fin:
                deliver(bytes(data))
                return
        elif opcode is not Opcode.CONT:
            return  # PING, PONG, CLOSE: the protocol answered them
        if self._text is None:
            self._binary.append(bytes(data))
            if frame.fin:
                deliver(b"".join(self._binary))
                self._binary.clear()
        else:
            # Decoded fragment by fragment, to fail invalid UTF-8 early.
            self._chars.append(self._text.decode(data, frame.fin))
            if frame.fin:
                deliver("".join(self._chars))
                self._chars.clear()

    def send_nowait(self, message: Message) -> None:
        """Queue a text (str) or binary (bytes) message; `flush` sends it.

        Raises:
            ConnectionClosed: if a CLOSE has been sent or received.
        """
        if self._protocol.state is not State.OPEN:
            raise self._closed()
        if isinstance(message, str):
            self._protocol.send_text(message.encode())
        else:
            self._protocol.send_binary(message)

    async def send(self, message: Message) -> None:
        """Send a message: `send_nowait`, then ``flush(wait=False)``. A checkpoint.

        Raises:
            ConnectionClosed: if a CLOSE has been sent or received.
        """
        self.send_nowait(message)
        await self.flush(wait=False)

    async def flush(self, *, wait: bool = True) -> None:
        """Send what the protocol has queued; half-close TCP when it says so.

        One task sends at a time, all that is queued, until nothing is left.
        With ``wait=True`` it sends at once; with ``wait=False`` (many small
        senders) it first lets the others queue theirs, to send them
        together, and a caller whose bytes the sending task will take along
        returns at once (unless `HIGH_WATER` bytes are queued: then it
        waits its turn, which is the backpressure). Cancel-safe: what a
        cancellation stops before it is sent stays queued, to the byte. A
        checkpoint only when there is something to send.
        """
        for data in self._protocol.data_to_send():
            if data:
                self._out += data
            else:
                self._eof_due = True
        if not (self._out or self._eof_due):
            return
        lock = self._send_lock
        if wait and not lock.locked():
            lock.acquire_nowait()  # send now: the sending is the checkpoint
        elif not wait and lock.locked() and len(self._out) < HIGH_WATER:
            await trio.lowlevel.checkpoint()
            return
        else:
            # A checkpoint even when the lock is free: what other tasks
            # queue meanwhile goes out in the same send.
            await lock.acquire()
        try:
            while self._out:
                # The socket's own send, not send_all: a cancelled call has
                # sent nothing, so what is queued stays exact.
                sent = await self.stream.socket.send(self._out)
                del self._out[:sent]
            if self._eof_due:
                self._eof_due = False
                await self.stream.send_eof()
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            self._out.clear()
            self._protocol.receive_eof()
        finally:
            lock.release()

    async def aclose(self, code: int, reason: str) -> None:
        """Send CLOSE, drop what comes before the client's CLOSE, then return.

        The caller closes the TCP stream. Not bounded here: run it under the
        grace of a bundle. This is a checkpoint.
        """
        if self._protocol.state is State.OPEN:
            self._protocol.send_close(code, reason)
            await self.flush()
        while self._protocol.state is not State.CLOSED:
            if self._protocol.close_rcvd is not None:  # perhaps before ours
                return  # the handshake is complete: close TCP now
            data = await self.read_some()
            if data:
                self._protocol.receive_data(data)
            else:
                self._protocol.receive_eof()
            self._protocol.events_received()  # after our CLOSE: dropped
            if self._protocol.close_rcvd is None:
                await self.flush()
            # else the caller's closing of TCP is the half-close asked for

    @property
    def close_code(self) -> int:
        """The code of the CLOSE received, else sent; 1006 without one."""
        close = self._protocol.close_rcvd or self._protocol.close_sent
        return ABNORMAL if close is None else int(close.code)

    def _closed(self) -> ConnectionClosed:
        close = self._protocol.close_rcvd or self._protocol.close_sent
        if close is None:
            return ConnectionClosed(ABNORMAL, "")
        return ConnectionClosed(int(close.code), close.reason)


accept_websocket = WebSocket.accept
