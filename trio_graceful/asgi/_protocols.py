"""Hypercorn's HTTP/1.1 and HTTP/2 protocols, taught to drain.

Hypercorn's own shutdown, once its worker context says ``terminated``,
closes an HTTP/1.1 connection after the response in progress: requests
already pipelined behind it are dropped, and the response goes out without
``Connection: close``. Its HTTP/2 protocol sends GOAWAY only when the
connection is idle. The subclasses here change just that:

* HTTP/1.1 (`DrainingH11Protocol`): during a drain, the response that will
  be the last on its connection carries ``Connection: close``; a response is
  the last unless another complete request is already in the buffers
  (Hypercorn's, or the socket's, peeked without reading). The requests
  pipelined before STOP are all answered (after the cut-off, with a 503).
* HTTP/2 (`DrainingH2Protocol`): at STOP a GOAWAY naming the last stream
  received goes out at once, and the open streams finish; Hypercorn then
  refuses new streams and closes the connection when it is idle.

`open_protocol` picks one the way Hypercorn's ``ProtocolWrapper`` does,
including the switches to HTTP/2 that an HTTP/1.1 request may ask for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import h2.events
import h11
from h2.errors import ErrorCodes
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.events import Event as StreamEvent, Response
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.protocol.h11 import (
    H2CProtocolRequiredError,
    H2ProtocolAssumedError,
    H11Protocol,
)
from hypercorn.typing import AppWrapper, ConnectionState, TaskGroup, WorkerContext
from hyperframe.frame import GoAwayFrame

_CLOSE = (b"connection", b"close")


class DrainState(Protocol):
    """What a protocol asks its connection about the drain."""

    @property
    def draining(self) -> bool:
        """True once the server got STOP."""
        ...

    @property
    def cut_off(self) -> bool:
        """True once the connection's requests have been cut off."""
        ...

    def peek(self) -> bytes:
        """Return the bytes the socket holds, without reading them."""
        ...


def _holds_request(data: bytes) -> bool:
    """Tell whether ``data`` starts with a complete HTTP/1.1 request head."""
    if not data:
        return False
    scratch = h11.Connection(h11.SERVER)
    try:
        scratch.receive_data(data)
        return isinstance(scratch.next_event(), h11.Request)
    except h11.RemoteProtocolError:
        return False


class DrainingH11Protocol(H11Protocol):
    """Hypercorn's HTTP/1.1 protocol, answering what is pipelined at STOP."""

    drain: DrainState

    @property
    def idle(self) -> bool:
        """True between requests."""
        return self.stream is None

    def _is_last_response(self) -> bool:
        connection = self.connection
        if not isinstance(connection, h11.Connection):
            return True  # a WebSocket's handshake: nothing can follow
        if connection.their_state is not h11.DONE:
            # The request's own body is still coming: what follows it cannot
            # be told apart yet, so this response ends the connection.
            return True
        return not _holds_request(connection.trailing_data[0] + self.drain.peek())

    async def stream_send(self, event: StreamEvent) -> None:
        if (
            isinstance(event, Response)
            and event.status_code >= 200
            and self.drain.draining
            and _CLOSE not in event.headers
            and self._is_last_response()
        ):
            event = Response(
                stream_id=event.stream_id,
                headers=[*event.headers, _CLOSE],
                status_code=event.status_code,
            )
        await super().stream_send(event)

    async def _maybe_recycle(self) -> None:
        await self._close_stream()
        connection = self.connection
        if (
            isinstance(connection, h11.Connection)
            and connection.our_state is h11.DONE
            and connection.their_state is h11.DONE
        ):
            # Unlike Hypercorn, recycle during a drain too, and after the
            # cut-off: a response went out without "Connection: close" only
            # because another request is waiting to be answered. The states
            # are read after _close_stream, which yields: the client's FIN
            # may have come meanwhile.
            connection.start_next_cycle()
            await self.can_read.set()
            await self.send(Updated(idle=True))
        else:
            await self.can_read.set()
            await self.send(Closed())


class DrainingH2Protocol(H2Protocol):
    """Hypercorn's HTTP/2 protocol, sending GOAWAY as soon as STOP comes."""

    async def _handle_events(self, events: list[h2.events.Event]) -> None:
        if self.context.terminated.is_set():
            # Refuse a stream opened after STOP with REFUSED_STREAM, which
            # tells the client it was not processed and may be retried
            # (Hypercorn resets it with NO_ERROR), and drop its other frames.
            refused = {
                event.stream_id
                for event in events
                if isinstance(event, h2.events.RequestReceived)
            }
            for stream_id in refused:
                self.connection.reset_stream(stream_id, ErrorCodes.REFUSED_STREAM)
            events = [event for event in events if _stream_of(event) not in refused]
        await super()._handle_events(events)

    async def begin_drain(self) -> None:
        """Announce the shutdown: GOAWAY now, the open streams finish."""
        if self.idle:
            self.connection.close_connection()
        else:
            # h2's close_connection() would refuse to send anything more, so
            # the first GOAWAY is written by hand; Hypercorn sends h2's own
            # when the last stream has ended.
            frame = GoAwayFrame(
                0, last_stream_id=self.connection.highest_inbound_stream_id
            )
            await self.send(RawData(data=frame.serialize()))
        await self._flush()


def _stream_of(event: h2.events.Event) -> int | None:
    stream_id: object = getattr(event, "stream_id", None)
    return stream_id if isinstance(stream_id, int) else None


class ServerProtocol:
    """The protocol of one connection, switching to HTTP/2 when asked.

    Like Hypercorn's ``ProtocolWrapper``, with the draining protocols.
    """

    def __init__(
        self,
        app: AppWrapper,
        config: Config,
        context: WorkerContext,
        task_group: TaskGroup,
        state: ConnectionState,
        *,
        tls: bool,
        client: tuple[str, int] | None,
        server: tuple[str, int] | None,
        send: Callable[[Event], Awaitable[None]],
        drain: DrainState,
        alpn_protocol: str | None,
    ) -> None:
        self._args = (
            app,
            config,
            context,
            task_group,
            state,
            tls,
            client,
            server,
            send,
        )
        self._drain = drain
        self.protocol: DrainingH11Protocol | DrainingH2Protocol
        if alpn_protocol == "h2":
            self.protocol = DrainingH2Protocol(*self._args)
        else:
            h11_protocol = DrainingH11Protocol(*self._args)
            h11_protocol.drain = drain
            self.protocol = h11_protocol

    @property
    def idle(self) -> bool:
        """True if no request or stream is open."""
        return self.protocol.idle

    @property
    def announces_close(self) -> bool:
        """True if the client was told of the drain by the protocol (HTTP/2's GOAWAY).

        An idle HTTP/1.1 connection has no way to tell it: only a response
        can, with ``Connection: close``.
        """
        return isinstance(self.protocol, DrainingH2Protocol)

    async def initiate(self) -> None:
        """Start the protocol (HTTP/2 sends its settings)."""
        await self.protocol.initiate()

    async def begin_drain(self) -> None:
        """Tell the protocol that the server got STOP."""
        if isinstance(self.protocol, DrainingH2Protocol):
            await self.protocol.begin_drain()

    async def handle(self, event: Event) -> None:
        """Pass ``event`` to the protocol, switching to HTTP/2 if it asks."""
        try:
            await self.protocol.handle(event)
        except H2ProtocolAssumedError as error:
            await self._switch_to_h2(error.data)
        except H2CProtocolRequiredError as error:
            await self._switch_to_h2(error.data, error.headers, error.settings)

    async def _switch_to_h2(
        self,
        data: bytes,
        headers: list[tuple[bytes, bytes]] | None = None,
        settings: bytes | None = None,
    ) -> None:
        self.protocol = DrainingH2Protocol(*self._args)
        await self.protocol.initiate(headers, settings)
        if self._drain.draining:
            await self.protocol.begin_drain()
        if data:
            await self.protocol.handle(RawData(data=data))
