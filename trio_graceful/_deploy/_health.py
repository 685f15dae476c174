"""The HTTP health endpoint: ``/livez``, ``/readyz`` and ``/statusz``, on h11.

Orchestrators ask a process over HTTP whether it runs and whether it takes
work: Kubernetes' kubelet counts 200 to 399 as success, and anything else, a
refused connection or no answer within ``timeoutSeconds`` as a failure; it
sends ``Connection: close``, while load balancers keep connections alive.
This module is the mechanism: `serve_health` answers from a callable that
says what is true now (`HealthAnswer`); the runner decides what that is.

No client can hold the endpoint, and none can keep a probe out:

* a request (head, body, answer) must be done within ``idle_timeout`` of the
  previous one (or of the connection's opening), however slowly its bytes
  trickle in;
* a request's head must be complete within ``head_timeout`` of its *first
  byte*. Counted from the first byte, not from the opening, so that a
  keep-alive client may sit quiet between requests (``idle_timeout`` bounds
  that), while a slowloris, which must trickle bytes to look alive, loses its
  slot in ``head_timeout``; a real probe sends its head in one segment;
* at ``max_connections``, a new connection closes one that waits for a
  request, to take its slot: first those that never completed one, a
  request begun and not finished before an opening with no byte yet (a real
  client sends its head at once: a head in progress is a slowloris's mark), then
  keep-alive connections between requests; oldest first byte, or oldest
  wait, first. A connection whose request is being answered is never closed
  so; only when every slot holds one is the new connection refused. So a
  flood cannot lock a probe out: the probe is the newest opening, and while
  its head is on the way to be read, a slowloris's is closed before it;
* refusals and those closings are logged as one WARNING with the counts, at
  most once every ``REPORT_INTERVAL`` (10) seconds, not once per connection;
* a head is capped in size; an error on one connection ends that connection
  only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import Final, TypeAlias, final

import attrs
import h11
import trio

from .._core._checks import check_count, field_check
from .._core._inboxreceiver import InboxReceiver
from .._core._log import library_logger, plural
from .._core._lowlevel import NoPublicConstructor

logger = library_logger("trio_graceful.health")

_CHUNK: Final = 65536
# How long a closing connection waits for its client to read the last answer
# and close: closing with unread input would reset the connection, and the
# client could lose an answer it has not read yet.
_LINGER: Final = 1.0
_PATHS: Final = frozenset({b"/livez", b"/readyz", b"/statusz"})
_METHODS: Final = frozenset({b"GET", b"HEAD"})
_TEXT: Final = b"text/plain; charset=utf-8"
_JSON: Final = b"application/json"
_Reply: TypeAlias = "tuple[int, bytes, bytes]"  # status, content type, body

REPORT_INTERVAL: Final = 10.0
"""Seconds between two WARNING lines counting refused and evicted connections."""


@attrs.frozen
class HealthAnswer:
    """What the health endpoint says right now, returned by its ``answer`` callable."""

    live: bool
    """Whether the process runs (``/livez`` answers 200 if so, else 503)."""

    ready: bool
    """Whether it takes new work (``/readyz`` answers 200 if so, else 503)."""

    status: Mapping[str, object]
    """JSON-able values, served at ``/statusz`` (keys sorted)."""

    reason: str = ""
    """Why it is not ready, or ready with a part not working (degraded), for
    the body of ``/readyz``."""


@attrs.frozen
class HealthStatistics:
    """Counts kept by a running health endpoint (`HealthEndpoint.statistics`)."""

    connections: int
    """Connections open now."""

    answered: int
    """Answers sent, whatever their status."""

    refused: int
    """New connections closed at once, as ``max_connections`` were open and
    each was answering a request."""

    timed_out: int
    """Connections closed because a request was not done within ``idle_timeout``."""

    evicted: int = 0
    """Connections waiting for a request, closed to admit a new connection at
    ``max_connections``."""

    slow_heads: int = 0
    """Connections closed because a request head was not complete within
    ``head_timeout`` of its first byte."""


@attrs.define(eq=False)
class _Connection:
    stream: trio.abc.Stream
    http: h11.Connection
    waiting_since: float  # when it began to wait for its current request
    answered: int = 0  # requests answered on it
    head_begun: float | None = None  # the first byte of the current request
    reading: trio.CancelScope | None = None  # while waiting for the client
    evicted: bool = False

    def eviction_order(self) -> tuple[bool, bool, float]:
        """Sorts first the connection to evict first (see the module docstring)."""
        if self.head_begun is None:
            return self.answered > 0, True, self.waiting_since
        return self.answered > 0, False, self.head_begun


@final
@attrs.define(eq=False)
class HealthEndpoint(metaclass=NoPublicConstructor):
    """A running health endpoint: `serve_health` reports it when it is ready."""

    _inbox: InboxReceiver[object]
    _answer: Callable[[], HealthAnswer]
    _idle_timeout: float
    _head_timeout: float
    _max_connections: int = attrs.field(validator=field_check(check_count))
    _max_header_bytes: int = attrs.field(validator=field_check(check_count))
    # A dict for its order: among equal waits, the first admitted goes first.
    _connections: dict[_Connection, None] = attrs.field(
        factory=dict["_Connection", None], init=False
    )
    _answered: int = attrs.field(default=0, init=False)
    _refused: int = attrs.field(default=0, init=False)
    _timed_out: int = attrs.field(default=0, init=False)
    _evicted: int = attrs.field(default=0, init=False)
    _slow_heads: int = attrs.field(default=0, init=False)
    # The refused and evicted counts as last logged.
    _reported: tuple[int, int] = attrs.field(default=(0, 0), init=False)
    # Set at each refusal or eviction: `_report_periodically` has news.
    _news: trio.Event = attrs.field(factory=trio.Event, init=False)

    def statistics(self) -> HealthStatistics:
        """Return a `HealthStatistics` snapshot. Not a checkpoint."""
        return HealthStatistics(
            connections=len(self._connections),
            answered=self._answered,
            refused=self._refused,
            timed_out=self._timed_out,
            evicted=self._evicted,
            slow_heads=self._slow_heads,
        )

    def _stop_reading(self) -> None:
        """Close every connection that waits for its client (STOP came)."""
        for connection in self._connections:
            if connection.reading is not None:
                connection.reading.cancel(reason="the health endpoint is stopping")

    def _make_room(self) -> bool:
        """Evict the first waiting connection in eviction order; False if none waits."""
        waiting = [c for c in self._connections if c.reading is not None]
        if not waiting:
            return False
        victim = min(waiting, key=_Connection.eviction_order)
        victim.evicted = True
        assert victim.reading is not None
        victim.reading.cancel(reason="evicted to admit a new health connection")
        del self._connections[victim]
        self._evicted += 1
        return True

    def _report(self) -> None:
        """Log the refusals and evictions since the last report, if any."""
        refused, evicted = self._reported
        if (self._refused, self._evicted) == self._reported:
            return
        self._reported = (self._refused, self._evicted)
        logger.warning(
            "health endpoint at max_connections=%d: closed %s "
            "waiting for a request to admit new ones, refused %s "
            "(%d closed, %d refused in all)",
            self._max_connections,
            plural(self._evicted - evicted, "connection"),
            plural(self._refused - refused, "new one"),
            self._evicted,
            self._refused,
        )

    async def _report_periodically(self) -> None:
        """Log `_report` when there is news, at most once every `REPORT_INTERVAL`."""
        while True:
            await self._news.wait()
            self._news = trio.Event()
            self._report()
            await trio.sleep(REPORT_INTERVAL)

    async def _serve(self, stream: trio.abc.Stream) -> None:
        """Serve one connection; `trio.serve_listeners` closes the stream after."""
        if len(self._connections) >= self._max_connections:
            self._news.set()
            if not self._make_room():
                self._refused += 1
                return
        http = h11.Connection(
            h11.SERVER, max_incomplete_event_size=self._max_header_bytes
        )
        connection = _Connection(stream, http, trio.current_time())
        self._connections[connection] = None
        try:
            while True:
                with trio.move_on_after(self._idle_timeout):
                    if not await self._exchange(connection):
                        break
                    http.start_next_cycle()
                    connection.answered += 1
                    connection.head_begun = None
                    connection.waiting_since = trio.current_time()
                    continue
                # Here only when the time was up.
                self._timed_out += 1
                logger.debug(
                    "health endpoint: closed a connection with no complete "
                    "request for %s s",
                    self._idle_timeout,
                )
                return
            if http.our_state is h11.MUST_CLOSE:
                await _linger(stream)
        except trio.BrokenResourceError as exc:
            logger.debug("health endpoint: a client went away: %r", exc)
        except Exception:
            logger.exception("health endpoint: a connection failed")
        finally:
            self._connections.pop(connection, None)

    async def _exchange(self, connection: _Connection) -> bool:
        """Read a request and answer it; tell whether the connection carries on."""
        try:
            request = await self._receive_request(connection)
        except h11.RemoteProtocolError as exc:
            # Nothing was sent yet: we answer only whole requests.
            logger.debug("health endpoint: bad request: %s", exc)
            await self._send(
                connection, b"GET", _text(exc.error_status_hint), close=True
            )
            return False
        if request is None:
            return False
        method, target = request.method, request.target
        try:
            reply = _reply(method, target, self._answer)
        except Exception:
            logger.exception(
                "health endpoint: no answer for %s %s",
                method.decode(),
                target.decode("ascii", "replace"),
            )
            reply = _text(500)
        close = self._inbox.stop_received
        await self._send(connection, method, reply, close=close)
        return connection.http.our_state is h11.DONE

    async def _receive_request(self, connection: _Connection) -> h11.Request | None:
        """Read a request, dropping any body; None if the client closed or STOP came.

        Raises:
            h11.RemoteProtocolError: if the request is not valid HTTP/1.1.
        """
        http = connection.http
        request: h11.Request | None = None
        with trio.CancelScope() as head:
            if http.trailing_data[0]:  # pipelined: its first bytes are here
                self._begin_head(connection, head)
            while True:
                event = http.next_event()
                if event is h11.NEED_DATA:
                    data = await self._receive(connection)
                    if data is None:
                        return None
                    if request is None and data and head.deadline == math.inf:
                        self._begin_head(connection, head)
                    http.receive_data(data)
                elif isinstance(event, h11.Request):
                    request = event
                    head.deadline = math.inf  # the body has idle_timeout
                elif isinstance(event, h11.EndOfMessage):
                    return request
                elif not isinstance(event, h11.Data):
                    return None  # h11.ConnectionClosed: the client closed first
        # Here only when the head's time was up.
        self._slow_heads += 1
        logger.debug(
            "health endpoint: closed a connection whose request head was not "
            "complete %s s after its first byte",
            self._head_timeout,
        )
        return None

    def _begin_head(self, connection: _Connection, head: trio.CancelScope) -> None:
        """The first bytes of a request's head are here: start its clock."""
        connection.head_begun = trio.current_time()
        head.deadline = connection.head_begun + self._head_timeout

    async def _receive(self, connection: _Connection) -> bytes | None:
        """Return the next bytes from the client (b"" at its end).

        None after STOP, or if the connection was evicted to admit a new one.
        """
        if not self._inbox.stop_received:
            data = None
            with trio.CancelScope() as connection.reading:
                try:
                    data = bytes(await connection.stream.receive_some(_CHUNK))
                finally:
                    connection.reading = None
            if connection.evicted:
                return None  # even with bytes: its slot is someone else's now
            if data is not None:
                return data
        http = connection.http
        if http.their_state is not h11.IDLE or http.trailing_data[0]:
            logger.debug("health endpoint: stopped with a request partly received")
        return None

    async def _send(
        self, connection: _Connection, method: bytes, reply: _Reply, *, close: bool
    ) -> None:
        status, content_type, body = reply
        headers = [
            (b"content-type", content_type),
            (b"content-length", b"%d" % len(body)),
            (b"cache-control", b"no-store"),
        ]
        if status == HTTPStatus.METHOD_NOT_ALLOWED:
            headers.append((b"allow", b"GET, HEAD"))
        if close:
            headers.append((b"connection", b"close"))
        phrase = HTTPStatus(status).phrase.encode()
        events: list[h11.Event] = [
            h11.Response(status_code=status, headers=headers, reason=phrase)
        ]
        if method != b"HEAD":
            events.append(h11.Data(data=body))
        events.append(h11.EndOfMessage())
        http = connection.http
        data = b"".join(http.send(event) or b"" for event in events)
        await connection.stream.send_all(data)
        self._answered += 1


def _text(status: int, text: str = "") -> _Reply:
    body = (text or HTTPStatus(status).phrase.lower()) + "\n"
    return status, _TEXT, body.encode()


def _reply(method: bytes, target: bytes, answer: Callable[[], HealthAnswer]) -> _Reply:
    """Return the status, content type and body that answer a request."""
    path = target.partition(b"?")[0]
    if path not in _PATHS:
        return _text(HTTPStatus.NOT_FOUND)
    if method not in _METHODS:
        return _text(HTTPStatus.METHOD_NOT_ALLOWED)
    now = answer()  # at each request: a probe sees the state of this instant
    if path == b"/livez":
        return _text(200, "live") if now.live else _text(503, "not live")
    if path == b"/readyz":
        if now.ready:
            return _text(200, f"ready: {now.reason}" if now.reason else "ready")
        return _text(503, f"not ready: {now.reason}" if now.reason else "not ready")
    # Strict JSON: Infinity and NaN are JavaScript, and parsers refuse them.
    body = json.dumps(dict(now.status), sort_keys=True, allow_nan=False)
    return 200, _JSON, body.encode()


async def _linger(stream: trio.abc.Stream) -> None:
    """Say we are done sending, and read until the client closes, for a short while."""
    with trio.move_on_after(_LINGER):
        if isinstance(stream, trio.abc.HalfCloseableStream):
            await stream.send_eof()
        while await stream.receive_some(_CHUNK):
            pass
