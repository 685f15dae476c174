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
  received goes out at once, and the open streams finish; a stream opened
  after it is refused. Once every stream it named has ended (its
  END_STREAM written), a final GOAWAY naming the same stream goes out, and
  the connection closes after it.

`ServerProtocol` picks one the way Hypercorn's ``ProtocolWrapper`` does,
including the switches to HTTP/2 that an HTTP/1.1 request may ask for.

Port map, read against Hypercorn 0.18.0 (``hypercorn/protocol/h11.py``,
``h2.py`` and ``__init__.py``; h11 0.16, h2 4.4), so that upstream changes
can be ported. Each override says beside its code what upstream does there
and what differs; the private upstream names the overrides rely on are
listed last, as what to check first on an upgrade:

==================================  ===========================================
here                                Hypercorn 0.18
==================================  ===========================================
DrainingH11Protocol.stream_send     H11Protocol.stream_send (+ ``Connection:
                                    close`` on the last response of a drain)
DrainingH11Protocol._maybe_recycle  H11Protocol._maybe_recycle (recycles
                                    during a drain too)
DrainingH11Protocol.idle            (none: read by our connection, as
                                    ``H2Protocol.idle`` is)
DrainingH2Protocol.idle             H2Protocol.idle (after STOP: once the
                                    final GOAWAY is out)
DrainingH2Protocol.handle           H2Protocol.handle (drops input after the
                                    final GOAWAY; closes the stream buffers)
DrainingH2Protocol.stream_send      H2Protocol.stream_send, its
                                    ``StreamClosed`` branch replaced
DrainingH2Protocol._send_data       H2Protocol._send_data (+ drain check)
DrainingH2Protocol._create_stream   H2Protocol._create_stream (+ the highest
                                    stream accepted)
DrainingH2Protocol._handle_events   H2Protocol._handle_events, its branch for
                                    a ``RequestReceived`` after ``terminated``
                                    replaced
DrainingH2Protocol.begin_drain      (none: upstream sends GOAWAY only from
                                    ``stream_send``, once idle; here
                                    ``_announce`` and ``_close_if_drained``)
ServerProtocol                      ProtocolWrapper (+ the drain passed on,
                                    and told after a switch to HTTP/2)
==================================  ===========================================

Upstream private names used: ``H11Protocol._close_stream``, ``.can_read``,
``.connection``, ``.keep_alive_requests``, ``.stream``;
``H2Protocol._close_stream``, ``._flush``, ``.closed``, ``.connection``,
``.stream_buffers``; the worker context's ``terminated``.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

import h2.events
import h11
from h2.errors import ErrorCodes
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.events import Event as StreamEvent, Response, StreamClosed
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.protocol.h11 import (
    H2CProtocolRequiredError,
    H2ProtocolAssumedError,
    H11Protocol,
)
from hypercorn.typing import AppWrapper, ConnectionState, TaskGroup, WorkerContext
from hyperframe.frame import GoAwayFrame

from .._core._statetable import StateTable

_CLOSE = (b"connection", b"close")
# Who moves along DRAIN_PHASES, for the message of a refused move.
_SUBJECT: Final = "an HTTP/2 connection's drain"


class DrainingConnection(Protocol):
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

    drain: DrainingConnection

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
        # Upstream turns a final Response into h11's, adding its own
        # "Connection: close" only at keep_alive_max_requests; the rest of
        # its events pass as they are. Here a final Response gets the header
        # during a drain too, if it is the last answer of its connection,
        # before upstream's code runs.
        if (
            isinstance(event, Response)
            and event.status_code >= 200
            and self.drain.draining
            and _CLOSE not in event.headers
            # Hypercorn adds its own at keep_alive_max_requests.
            and self.keep_alive_requests < self.config.keep_alive_max_requests
            and self._is_last_response()
        ):
            event = Response(
                stream_id=event.stream_id,
                headers=[*event.headers, _CLOSE],
                status_code=event.status_code,
            )
        await super().stream_send(event)

    async def _maybe_recycle(self) -> None:
        # Upstream, on the stream's StreamClosed:
        #
        #     await self._close_stream()
        #     if (
        #         not self.context.terminated.is_set()
        #         and self.connection.our_state is h11.DONE
        #         and self.connection.their_state is h11.DONE
        #     ):
        #         try:
        #             self.connection.start_next_cycle()
        #         except h11.LocalProtocolError:
        #             await self.send(Closed())
        #         else:
        #             self.response = None
        #             self.scope = None
        #             await self.can_read.set()
        #             await self.send(Updated(idle=True))
        #     else:
        #         await self.can_read.set()
        #         await self.send(Closed())
        #
        # Here the connection is recycled during a drain too, and after the
        # cut-off: a response went out without "Connection: close" only
        # because another request is waiting to be answered. The states are
        # read after _close_stream, which yields: the client's FIN may have
        # come meanwhile. Upstream's guard around start_next_cycle is left
        # out because it cannot fire: h11 0.16 raises LocalProtocolError
        # there only if the states are not both DONE (h11/_state.py,
        # ConnectionState.start_next_cycle), and they were read just above,
        # with no checkpoint between; a WebSocket's H11WSConnection never
        # gets here (the isinstance test). Upstream's ``response`` and
        # ``scope`` are attributes nothing reads.
        await self._close_stream()
        connection = self.connection
        if (
            isinstance(connection, h11.Connection)
            and connection.our_state is h11.DONE
            and connection.their_state is h11.DONE
        ):
            connection.start_next_cycle()
            await self.can_read.set()
            await self.send(Updated(idle=True))
        else:
            await self.can_read.set()
            await self.send(Closed())


class DrainPhase(enum.Enum):
    """Where an HTTP/2 connection is in its drain."""

    SERVING = "serving"  # no GOAWAY yet
    ANNOUNCED = "announced"  # GOAWAY sent: the streams it names finish
    CLOSED = "closed"  # they have ended; the final GOAWAY is sent


class DrainStep(enum.Enum):
    """The two GOAWAYs of a drain."""

    ANNOUNCE = "announce the drain"  # the first, at STOP
    CLOSE = "close the connection"  # the final, once drained


# A drain's phase only advances, one GOAWAY at a time.
DRAIN_PHASES: Final = StateTable[DrainPhase, DrainStep](
    {
        (DrainPhase.SERVING, DrainStep.ANNOUNCE): DrainPhase.ANNOUNCED,
        (DrainPhase.ANNOUNCED, DrainStep.CLOSE): DrainPhase.CLOSED,
    },
    DrainPhase,
)


class DrainingH2Protocol(H2Protocol):
    """Hypercorn's HTTP/2 protocol, sending GOAWAY as soon as STOP comes.

    Upstream's drain closes the connection (h2's ``close_connection()``) in
    ``stream_send``, when a stream's ``StreamClosed`` leaves no stream open.
    That event follows the app's last body message, whose wait
    (``StreamBuffer.drain``) ends when the send task has *taken* the last
    bytes, before it has written them and the stream's END_STREAM: the
    GOAWAY could overtake them, and h2, closed, then refused the END_STREAM
    (the send task drops that error), so the client got a response without
    its end. And ``close_connection()`` names ``highest_inbound_stream_id``,
    which counts the streams refused since the first GOAWAY.

    Here a GOAWAY naming the last stream accepted goes out at STOP, and the
    connection is closed once *drained*: no stream open (upstream's
    ``idle``) and no stream buffer left, each buffer being dropped only
    after its END_STREAM (or its stream's reset). The final GOAWAY is h2's
    own, ``NO_ERROR``, naming the same stream as the first. The phase
    (`DrainPhase`) moves only along `DRAIN_PHASES`, and each step has one
    writer: ``_announce``, then ``_close_if_drained``. Each override says
    what upstream does there (the module docstring has the map).
    """

    _phase = DrainPhase.SERVING
    # The highest stream the client opened that went to the app.
    _accepted = 0
    # The last stream the GOAWAYs name, fixed by the first.
    _last_stream_id = 0

    @property
    def idle(self) -> bool:
        """True if no stream is open; after STOP, once the final GOAWAY is out."""
        # Upstream: no stream, or every stream idle. After STOP the TCP
        # server closes an idle connection: not before the final GOAWAY.
        if self.context.terminated.is_set():
            return self._phase is DrainPhase.CLOSED
        return super().idle

    async def begin_drain(self) -> None:
        """Announce the shutdown: GOAWAY now, the open streams finish."""
        if self._phase is DrainPhase.SERVING:
            await self._announce()
        await self._close_if_drained()

    async def handle(self, event: Event) -> None:
        # Upstream: RawData goes to h2 and its events to _handle_events (a
        # ProtocolError flushes h2's answer and closes); Closed sets
        # ``closed``, closes every stream and wakes the send task. Here,
        # once the final GOAWAY is out, what the client still sends is
        # dropped: h2, closed, would answer any frame with a second GOAWAY,
        # PROTOCOL_ERROR. And at Closed the stream buffers are closed too:
        # upstream's send task ends and leaves them open, so an app waiting
        # for its last body to go out waited until the cut-off.
        if (
            isinstance(event, RawData)
            and event.data
            and self._phase is DrainPhase.CLOSED
        ):
            return
        await super().handle(event)
        if isinstance(event, Closed):
            # Nothing will be sent any more: end the apps' waits to send.
            for buffer in list(self.stream_buffers.values()):
                await buffer.close()

    async def stream_send(self, event: StreamEvent) -> None:
        # Upstream's StreamClosed branch:
        #
        #     await self._close_stream(event.stream_id)
        #     idle = len(self.streams) == 0 or all(
        #         stream.idle for stream in self.streams.values()
        #     )
        #     if idle and self.context.terminated.is_set():
        #         self.connection.close_connection()
        #         await self._flush()
        #     await self.send(Updated(idle=idle))
        #
        # Here the connection closes only once drained (see the class
        # docstring). Upstream wraps its branches in a guard
        # against BufferCompleteError, KeyError, priority's
        # MissingStreamError and h2's ProtocolError, which the branches for
        # bodies and pushes can raise; the StreamClosed path here raises
        # none of them: _close_stream looks the stream up first, and h2
        # accepts SEND_GOAWAY (close_connection) in every connection state.
        # Every other event goes to upstream, guard included.
        if not isinstance(event, StreamClosed):
            await super().stream_send(event)
            return
        await self._close_stream(event.stream_id)
        await self._close_if_drained()
        await self.send(Updated(idle=self.idle))

    async def _send_data(self, stream_id: int) -> None:
        # Upstream's, run by the send task: writes a chunk of the stream's
        # buffer and, once the buffer is complete, its END_STREAM, and drops
        # the buffer. That is when a drain can be over: checked here.
        await super()._send_data(stream_id)
        await self._close_if_drained()

    async def _create_stream(self, request: h2.events.RequestReceived) -> None:
        # Upstream's; first the highest stream the client opened that goes
        # to the app, which the GOAWAYs name (h2's highest_inbound_stream_id
        # would count the streams refused too).
        if request.stream_id % 2:  # opened by the client; a push's is even
            self._accepted = max(self._accepted, request.stream_id)
        await super()._create_stream(request)

    async def _handle_events(self, events: list[h2.events.Event]) -> None:
        # Upstream's branch for a request, in its loop over the events:
        #
        #     if isinstance(event, h2.events.RequestReceived):
        #         if self.context.terminated.is_set():
        #             self.connection.reset_stream(event.stream_id)
        #             self.connection.update_settings(
        #                 {h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 0}
        #             )
        #         else:
        #             await self._create_stream(event)
        #             await self.send(Updated(idle=False))
        #
        # that is, after ``terminated``, a reset with NO_ERROR, and every
        # other event passed on. Here, after STOP, a GOAWAY goes out first if
        # none has yet; a stream above the one it names is reset with
        # REFUSED_STREAM, which tells the client that it was not processed
        # and may be retried, and its other frames are dropped (their data
        # acknowledged, so that the connection's window stays right); the
        # rest goes to upstream, which so never sees a request after STOP
        # (every stream opened since has a higher id than the GOAWAY names).
        if not self.context.terminated.is_set():
            await super()._handle_events(events)
            return
        if self._phase is DrainPhase.SERVING:
            await self._announce()
        refused = {
            event.stream_id
            for event in events
            if isinstance(event, h2.events.RequestReceived)
            and event.stream_id > self._last_stream_id
        }
        for stream_id in refused:
            self.connection.reset_stream(stream_id, ErrorCodes.REFUSED_STREAM)
        kept: list[h2.events.Event] = []
        for event in events:
            if _stream_of(event) not in refused:
                kept.append(event)
            elif isinstance(event, h2.events.DataReceived):
                self.connection.acknowledge_received_data(
                    event.flow_controlled_length, event.stream_id
                )
        await super()._handle_events(kept)
        await self._close_if_drained()

    @property
    def _drained(self) -> bool:
        return super().idle and not self.stream_buffers

    async def _announce(self) -> None:
        """Fix the last stream to answer; send the first GOAWAY unless drained."""
        self._phase = DRAIN_PHASES.move(
            self._phase, DrainStep.ANNOUNCE, subject=_SUBJECT
        )
        self._last_stream_id = self._accepted
        if not self._drained:
            # h2's close_connection() would refuse to send anything more, so
            # the first GOAWAY is written by hand.
            await self._flush()
            frame = GoAwayFrame(0, last_stream_id=self._last_stream_id)
            await self.send(RawData(data=frame.serialize()))

    async def _close_if_drained(self) -> None:
        """After the first GOAWAY, once drained: the final one; then idle."""
        if self.closed or self._phase is not DrainPhase.ANNOUNCED or not self._drained:
            return
        self._phase = DRAIN_PHASES.move(self._phase, DrainStep.CLOSE, subject=_SUBJECT)
        self.connection.close_connection(last_stream_id=self._last_stream_id)
        await self._flush()
        await self.send(Updated(idle=True))


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
        drain: DrainingConnection,
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
