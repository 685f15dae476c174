"""A WebSocket server that shuts down gracefully, CLOSE frames and all.

The protocol: a client sends text frames ``{"id": <int>, "work_ms": <int>}``;
the server works on each request for ``work_ms`` milliseconds and answers
``{"id": <int>}``. Requests may be pipelined: each connection works on them
concurrently, in a nested bundle, and answers them in the order they finish.
A text frame that is not such a request gets an error reply
``{"error": "...", "id": ...}`` (``id`` when the frame had a valid one); a
binary frame gets CLOSE 1003 (unsupported data).

On SIGTERM or SIGINT the server shuts down gracefully:

1. It stops accepting at once: the listening socket is closed, so new
   connections are refused; a connection still in its opening handshake is
   closed.
2. Every open connection takes no new requests, finishes and answers the ones
   it has received (giving them ``--request-grace`` seconds), then sends
   CLOSE 1001 (going away), waits for the client's CLOSE and closes the TCP
   connection. Requests that arrive once the shutdown has begun are not
   processed; those after the server's CLOSE are dropped, as RFC 6455
   (section 5.5.1) allows.
3. ``--grace`` bounds the whole drain: connections still open when it runs
   out are closed at once, without CLOSE. The outer grace wins over
   ``--request-grace``.
4. It logs a one-line summary and exits with status 0.

A second signal during the shutdown ends the process at once, with status
128 + the number of the first signal; the exit closes the connections still
open. The signals are handled by `trio_graceful.run`.

A client that sends CLOSE by itself gets a CLOSE with the same code back at
once (trio-websocket answers it), also during the shutdown, while everyone
else keeps being served. Invalid UTF-8 in a text frame fails the connection;
trio-websocket then closes it without the CLOSE 1007 that RFC 6455 asks for.

Run it::

    python examples/websocket_close_server.py --port 8000

or see everything at once (in-process clients, a shutdown after 3 seconds and
a report)::

    python examples/websocket_close_server.py --demo

Try: connect with ``python -m websockets ws://127.0.0.1:8000/``, send
``{"id": 1, "work_ms": 5000}`` and press Ctrl+C in the server's terminal: the
answer still arrives, then the CLOSE 1001. Press Ctrl+C twice to exit at once.
Run the demo with ``--grace 0.5`` to watch slow requests being cut off, and
with ``--log-level DEBUG`` to follow every request.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import logging
import math
import random
import signal
import sys
from collections import Counter
from collections.abc import Callable, Sequence

import attrs
import trio
import trio_websocket
from trio_websocket import ConnectionClosed

import trio_graceful
from trio_graceful import STOP, StopType

logger = logging.getLogger("websocket_close_server")

GOING_AWAY = 1001
"""The CLOSE code of a server that is shutting down (RFC 6455, 7.4.1)."""

UNSUPPORTED_DATA = 1003
"""The CLOSE code for a frame of a type the server does not accept."""

MAX_WORK_MS = 3_600_000
"""The longest work a request may ask for: one hour."""

MAX_DIGITS = 100
"""The longest number a request may contain."""

HANDSHAKE_TIMEOUT = 10.0
"""Seconds a new TCP connection has to complete the WebSocket opening handshake."""

DEMO_SHUTDOWN_AFTER = 3.0
"""Seconds into the demo at which the graceful shutdown begins."""


# -- the protocol -------------------------------------------------------------


@attrs.frozen
class Request:
    """A valid request: work for ``work_ms`` milliseconds, then answer ``id``."""

    id: int
    work_ms: int


class InvalidRequest(ValueError):
    """A text frame that is not a valid request; its client gets an error reply."""

    def __init__(self, message: str, request_id: int | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id

    def reply(self) -> str:
        """Return the error reply, a JSON text."""
        if self.request_id is None:
            return json.dumps({"error": str(self)})
        return json.dumps({"id": self.request_id, "error": str(self)})


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _parse_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_DIGITS:
        raise InvalidRequest(f"request has a number longer than {MAX_DIGITS} digits")
    return int(digits)


def parse_request(text: str) -> Request:
    """Parse a text frame into a `Request`. Keys other than the two are ignored.

    Raises:
        InvalidRequest: if ``text`` is not a JSON object with an integer
            ``id`` and an integer ``work_ms`` from 0 to `MAX_WORK_MS`.
    """
    try:
        value = json.loads(text, parse_int=_parse_int)
    except InvalidRequest:
        raise
    except RecursionError:
        raise InvalidRequest("request is not valid JSON: it nests too deeply") from None
    except ValueError as exc:
        raise InvalidRequest(f"request is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidRequest(
            f'request must be a JSON object {{"id": <int>, "work_ms": <int>}}, '
            f"not {_show(value)}"
        )
    if "id" not in value:
        raise InvalidRequest("request must have an id")
    request_id = value["id"]
    if not _is_int(request_id):
        raise InvalidRequest(f"id must be an integer, not {_show(request_id)}")
    if "work_ms" not in value:
        raise InvalidRequest("request must have a work_ms", request_id)
    work_ms = value["work_ms"]
    if not (_is_int(work_ms) and 0 <= work_ms <= MAX_WORK_MS):
        raise InvalidRequest(
            f"work_ms must be an integer from 0 to {MAX_WORK_MS}, not {_show(work_ms)}",
            request_id,
        )
    return Request(request_id, work_ms)


# -- the server -------------------------------------------------------------


def check_seconds(name: str, value: float) -> float:
    """Return ``value`` if it is a number of seconds >= 0 (`math.inf` is fine).

    Raises:
        TypeError: if ``value`` is not a number.
        ValueError: if ``value`` is negative or NaN.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {value!r}")
    if not value >= 0:  # also catches NaN
        raise ValueError(f"{name} must be >= 0, not {value!r}")
    return float(value)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


@attrs.frozen
class ShutdownSummary:
    """What a graceful shutdown did; ``str()`` gives the one-line log entry."""

    closed_gracefully: int
    """Connections that ended within the grace, after the close handshake."""

    hard_closed: int
    """Connections still open when the grace ran out, closed without CLOSE."""

    completed_during_drain: int
    """Requests answered after the shutdown began."""

    unanswered_during_drain: int
    """Requests that ended unanswered after the shutdown began: cut off by a
    grace, or their connection closed first."""

    elapsed: float
    """Seconds from the start of the shutdown to the last connection's end."""

    def __str__(self) -> str:
        return (
            f"shutdown complete in {self.elapsed:.3f} s: "
            f"{_plural(self.closed_gracefully, 'connection')} closed gracefully, "
            f"{self.hard_closed} hard-closed; "
            f"{_plural(self.completed_during_drain, 'request')} completed during "
            f"the drain, {self.unanswered_during_drain} left unanswered"
        )


@attrs.define
class _Drain:
    """The tallies of a shutdown in progress."""

    started_at: float
    closed_gracefully: int = 0
    hard_closed: int = 0
    completed: int = 0
    unanswered: int = 0

    def summarize(self) -> ShutdownSummary:
        return ShutdownSummary(
            closed_gracefully=self.closed_gracefully,
            hard_closed=self.hard_closed,
            completed_during_drain=self.completed,
            unanswered_during_drain=self.unanswered,
            elapsed=trio.current_time() - self.started_at,
        )


@attrs.frozen
class ServerStatistics:
    """A snapshot of a `WorkServer`, returned by `WorkServer.statistics`."""

    connections_open: int
    """WebSocket connections open now."""

    connections_accepted: int
    """WebSocket connections accepted so far."""

    requests_received: int
    """Valid requests taken from the connections so far."""

    requests_answered: int
    """Requests answered so far."""

    requests_unanswered: int
    """Requests that ended without an answer: cut off by a grace, or their
    connection closed before the answer could be sent."""

    malformed_frames: int
    """Frames that were not valid requests (error replies and CLOSE 1003)."""

    draining: bool
    """True once the server has stopped accepting and is closing connections."""


def _check_request_grace(value: float) -> float:
    return check_seconds("request_grace", value)


def _check_in_flight(
    instance: object, attribute: attrs.Attribute[int], value: int
) -> None:
    if not _is_int(value) or value < 1:
        raise ValueError(f"{attribute.name} must be an integer >= 1, not {value!r}")


@attrs.define(eq=False)
class WorkServer:
    """The server. Run `serve` in a bundle; shut the bundle down to stop it.

    Each connection runs in a bundle of connections, with an inbox of that
    bundle, and works on its requests in a nested bundle of its own.
    """

    request_grace: float = attrs.field(
        default=20.0, kw_only=True, converter=_check_request_grace
    )
    """Seconds a connection gives its requests in flight once it gets STOP."""

    max_in_flight: int = attrs.field(
        default=1000, kw_only=True, validator=_check_in_flight
    )
    """Requests a connection works on at once; beyond that it stops reading
    that connection until one is answered (backpressure)."""

    summary: ShutdownSummary | None = attrs.field(default=None, init=False)
    """What the shutdown did, once `serve` has returned after STOP."""

    _connections: trio_graceful.Bundle | None = attrs.field(default=None, init=False)
    _drain: _Drain | None = attrs.field(default=None, init=False)
    _draining: trio.Event = attrs.field(factory=trio.Event, init=False)
    _open: int = attrs.field(default=0, init=False)
    _accepted: int = attrs.field(default=0, init=False)
    _received: int = attrs.field(default=0, init=False)
    _answered: int = attrs.field(default=0, init=False)
    _unanswered: int = attrs.field(default=0, init=False)
    _malformed: int = attrs.field(default=0, init=False)

    def statistics(self) -> ServerStatistics:
        """Return a `ServerStatistics` snapshot."""
        return ServerStatistics(
            connections_open=self._open,
            connections_accepted=self._accepted,
            requests_received=self._received,
            requests_answered=self._answered,
            requests_unanswered=self._unanswered,
            malformed_frames=self._malformed,
            draining=self._draining.is_set(),
        )

    async def wait_draining(self) -> None:
        """Return once the server has stopped accepting and is closing connections."""
        await self._draining.wait()

    async def serve(
        self,
        inbox: trio_graceful.InboxReceiver[object],
        listeners: Sequence[trio.SocketListener],
        *,
        task_status: trio.TaskStatus[list[trio.SocketListener]] = (
            trio.TASK_STATUS_IGNORED
        ),
    ) -> None:
        """Serve WebSocket connections on ``listeners`` until `STOP` comes in ``inbox``.

        Then stop accepting (the listeners are closed), shut every connection
        down gracefully, log the `ShutdownSummary` and return. The drain is not
        bounded here: shut down the bundle that runs `serve` with a grace.
        Supports ``await bundle.start(server.serve, inbox, listeners)``.
        """
        try:
            async with trio_graceful.open_bundle(name="connections") as connections:
                self._connections = connections
                # Cancelling serve_listeners only closes the listeners; the
                # connections live on in their own bundle.
                stop = await inbox.until_stop(
                    functools.partial(
                        trio.serve_listeners,
                        self._serve_tcp,
                        list(listeners),
                        handler_nursery=connections,
                        task_status=task_status,
                    )
                )
                assert stop is STOP
                self._drain = _Drain(started_at=trio.current_time())
                self._draining.set()
                logger.info(
                    "stopped accepting connections; closing %s",
                    _plural(self._open, "open connection"),
                )
                await connections.shutdown(grace=math.inf)  # the caller bounds it
        finally:
            # Once the connections bundle has exited every connection has
            # ended, also when the caller's grace ran out.
            if self._drain is not None:
                self.summary = self._drain.summarize()
                logger.info("%s", self.summary)

    async def _serve_tcp(self, stream: trio.SocketStream) -> None:
        """Serve one TCP connection; runs in the connections bundle."""
        assert self._connections is not None
        _, inbox = self._connections.open_inbox()
        with inbox:
            # trio-websocket's reader task for this connection runs here.
            async with trio.open_nursery() as protocol:
                request: trio_websocket.WebSocketRequest | StopType | None = None
                with trio.move_on_after(HANDSHAKE_TIMEOUT):
                    # Waiting for the opening handshake is an idle point too:
                    # a connection that is not a WebSocket yet when the
                    # shutdown begins is simply closed.
                    request = await inbox.until_stop(
                        trio_websocket.wrap_server_stream, protocol, stream
                    )
                if request is not None and request is not STOP:
                    await self._serve_websocket(request, inbox)
                protocol.cancel_scope.cancel()

    async def _serve_websocket(
        self,
        request: trio_websocket.WebSocketRequest,
        inbox: trio_graceful.InboxReceiver[object],
    ) -> None:
        try:
            ws = await request.accept()
        except ConnectionClosed:
            return  # the client left during the opening handshake
        self._open += 1
        self._accepted += 1
        logger.debug("%s: connected from %s", ws, ws.remote)
        try:
            await self._converse(ws, inbox)
        except trio.Cancelled:
            if self._drain is not None:
                self._drain.hard_closed += 1
            logger.debug("%s: hard-closed", ws)
            raise
        finally:
            self._open -= 1
        if self._drain is not None:
            self._drain.closed_gracefully += 1

    async def _converse(
        self,
        ws: trio_websocket.WebSocketConnection,
        inbox: trio_graceful.InboxReceiver[object],
    ) -> None:
        async with trio_graceful.open_bundle(name=f"requests on {ws}") as requests:
            try:
                code, reason = await self._receive_requests(ws, inbox, requests)
            except ConnectionClosed as exc:
                # The client closed (trio-websocket has already answered its
                # CLOSE with the same code), or the connection was lost. No
                # answer can be sent any more.
                logger.debug("%s: closed by the client: %s", ws, exc.reason)
                await requests.cancel(grace=0)
                return
            # Answer what was received, then say goodbye. Once our CLOSE is
            # sent, trio-websocket drops the client's frames until its CLOSE.
            if requests.statistics().children_running:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._drop_frames_until_closed, ws, requests)
                    await requests.cancel(grace=self.request_grace)
                    nursery.cancel_scope.cancel()
            logger.debug("%s: sending CLOSE %d", ws, code)
            await ws.aclose(code, reason)
            logger.debug("%s: closed: %s", ws, ws.closed)

    async def _drop_frames_until_closed(
        self, ws: trio_websocket.WebSocketConnection, requests: trio_graceful.Bundle
    ) -> None:
        """Read and drop frames; if the connection closes, cut the requests off.

        While a connection finishes its requests it takes no new ones, but it
        keeps reading: so a client's CLOSE is still answered at once, and work
        whose answer can no longer be sent stops.
        """
        with contextlib.suppress(ConnectionClosed):
            while True:
                await ws.get_message()
        await requests.cancel(grace=0)

    async def _receive_requests(
        self,
        ws: trio_websocket.WebSocketConnection,
        inbox: trio_graceful.InboxReceiver[object],
        requests: trio_graceful.Bundle,
    ) -> tuple[int, str]:
        """Take requests until the server decides to close; return code and reason.

        Raises:
            ConnectionClosed: if the client closed or the connection was lost.
        """
        slots = trio.Semaphore(self.max_in_flight)
        while True:
            # Read a frame only when a request could start (backpressure).
            # Both waits are idle points: STOP ends them.
            if await inbox.until_stop(slots.acquire) is STOP:
                return GOING_AWAY, "the server is shutting down"
            message = await inbox.until_stop(ws.get_message)
            if message is STOP:
                return GOING_AWAY, "the server is shutting down"
            if isinstance(message, bytes):
                self._malformed += 1
                logger.info("%s: got a binary frame; closing with 1003", ws)
                return UNSUPPORTED_DATA, "this server accepts text frames only"
            try:
                job = parse_request(message)
            except InvalidRequest as exc:
                self._malformed += 1
                slots.release()
                logger.info("%s: %s", ws, exc)
                await ws.send_message(exc.reply())
                continue
            self._received += 1
            logger.debug("%s: received request %d (%d ms)", ws, job.id, job.work_ms)
            requests.start_soon(
                self._work, ws, job, slots, name=f"request {job.id} on {ws}"
            )

    async def _work(
        self,
        ws: trio_websocket.WebSocketConnection,
        job: Request,
        slots: trio.Semaphore,
    ) -> None:
        answered = False
        try:
            await trio.sleep(job.work_ms / 1000)  # the simulated work
            await ws.send_message(json.dumps({"id": job.id}))
            answered = True
        except ConnectionClosed:
            pass  # the connection closed first: nobody is left to answer
        finally:
            # Also when the request is cut off by a grace (trio.Cancelled).
            slots.release()
            if answered:
                self._answered += 1
                logger.debug("%s: answered request %d", ws, job.id)
            else:
                self._unanswered += 1
                logger.debug("%s: request %d left unanswered", ws, job.id)
            if self._drain is not None:
                if answered:
                    self._drain.completed += 1
                else:
                    self._drain.unanswered += 1


# -- running the server --------------------------------------------------------

EXIT_CODES = trio_graceful.ExitCodes(
    clean_signals=frozenset({signal.SIGINT, signal.SIGTERM}), clean_after_grace=True
)
"""Exit with status 0 after a graceful shutdown, whichever signal asked, also
when the grace had to cut off clients that never answered the CLOSE."""


def url_of(listener: trio.SocketListener) -> str:
    """Return the ``ws://`` URL a listener serves."""
    host, port = listener.socket.getsockname()[:2]
    return f"ws://[{host}]:{port}/" if ":" in host else f"ws://{host}:{port}/"


async def serve_until_shutdown(
    host: str,
    port: int,
    request_grace: float,
    *,
    task_status: trio.TaskStatus[object] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until the program shuts down: the ``main`` of `trio_graceful.run`.

    The runner owns the signals: the first SIGINT or SIGTERM sends STOP to
    the inbox opened here on its root bundle and gives the drain ``--grace``
    seconds; a second one ends the process at once.
    """
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        logger.error("cannot listen on %s port %d: %s", host, port, exc)
        raise SystemExit(1) from None
    _, inbox = trio_graceful.current_runner().root.open_inbox()
    logger.info("listening on %s", " ".join(map(url_of, listeners)))
    server = WorkServer(request_grace=request_grace)
    await server.serve(inbox, listeners, task_status=task_status)


# -- the demo -----------------------------------------------------------------


@attrs.define
class _DemoClient:
    """One demo client's record."""

    leaves_at: float | None
    sent: int = 0
    answered: int = 0
    close_code: int | None = None
    """The code of the CLOSE the server sent (for a client that closed by
    itself, the code the server answered with); 1006 if none came."""


def _describe_close_codes(codes: Counter[int | None]) -> str:
    return ", ".join(
        f"{n} got no CLOSE ({code})" if code in (None, 1006) else f"{n} got {code}"
        for code, n in sorted(codes.items(), key=lambda item: item[0] or 0)
    )


@attrs.frozen
class DemoReport:
    """What the demo saw, from both ends; ``str()`` gives the printed report."""

    clients: int
    shutdown_after: float
    grace: float
    requests_sent: int
    answers_received: int
    closed_by_server: str
    """The CLOSE codes the clients that stayed received, counted."""
    closed_by_client: str
    """The CLOSE codes the clients that left early got back, counted."""
    attempt_during_drain: str
    """What happened to a new connection attempted during the drain."""
    server: ServerStatistics
    summary: ShutdownSummary

    def __str__(self) -> str:
        server = self.server
        not_taken = self.requests_sent - server.requests_received
        return "\n".join(
            [
                f"demo: {self.clients} clients, graceful shutdown after "
                f"{self.shutdown_after:g} s (grace {self.grace:g} s)",
                f"  clients that stayed, CLOSE from the server: "
                f"{self.closed_by_server or 'none'}",
                f"  clients that closed first, CLOSE in answer: "
                f"{self.closed_by_client or 'none'}",
                f"  requests: {self.requests_sent} sent, "
                f"{self.answers_received} answers received",
                f"  server: {server.requests_received} received, "
                f"{server.requests_answered} answered, "
                f"{server.requests_unanswered} left unanswered "
                f"(their client closed first, or a grace ran out)",
                f"  {not_taken} requests not taken: they came in after the "
                f"shutdown began and were not processed",
                f"  a new connection during the drain: {self.attempt_during_drain}",
                f"  server log: {self.summary}",
            ]
        )


async def _demo_client(
    port: int, record: _DemoClient, rng: random.Random, ids: Callable[[], int]
) -> None:
    # The client owns its TCP stream: trio-websocket's own client does not
    # close its socket when the server closes first.
    async with (
        await trio.open_tcp_stream("127.0.0.1", port) as stream,
        trio.open_nursery() as protocol,
    ):
        ws = await trio_websocket.wrap_client_stream(protocol, stream, "127.0.0.1", "/")
        sending = trio.CancelScope()

        async def send_requests() -> None:
            with sending, contextlib.suppress(ConnectionClosed):
                while True:
                    request = {"id": ids(), "work_ms": rng.randint(100, 1500)}
                    await ws.send_message(json.dumps(request))
                    record.sent += 1
                    await trio.sleep(rng.uniform(0.05, 0.4))

        async def leave(at: float) -> None:
            await trio.sleep(at)
            sending.cancel()
            await ws.aclose()  # CLOSE 1000; returns once the server answered

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_requests)
            if record.leaves_at is not None:
                nursery.start_soon(leave, record.leaves_at)
            with contextlib.suppress(ConnectionClosed):
                while True:
                    json.loads(await ws.get_message())
                    record.answered += 1
            sending.cancel()
        assert ws.closed is not None
        record.close_code = ws.closed.code
        protocol.cancel_scope.cancel()


async def _attempt_connection(port: int) -> str:
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError as exc:
        return f"refused ({exc})"
    await stream.aclose()
    return "accepted"


async def run_demo(
    *,
    clients: int = 20,
    grace: float = 10.0,
    request_grace: float = 20.0,
    shutdown_after: float = DEMO_SHUTDOWN_AFTER,
    seed: int | None = None,
) -> DemoReport:
    """Serve ``clients`` local clients, shut down gracefully, report both ends.

    Every tenth client closes its connection by itself halfway to the
    shutdown. The others send requests with random work until the server's
    CLOSE arrives.
    """
    rng = random.Random(seed)
    next_id = itertools.count(1).__next__
    server = WorkServer(request_grace=request_grace)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    records = [
        _DemoClient(leaves_at=shutdown_after / 2 if i % 10 == 9 else None)
        for i in range(clients)
    ]
    attempt = ""
    async with (
        trio.open_nursery() as nursery,
        trio_graceful.open_bundle(name="server") as bundle,
    ):
        _, inbox = bundle.open_inbox()
        await bundle.start(server.serve, inbox, listeners)
        for record in records:
            client_rng = random.Random(rng.random())
            nursery.start_soon(_demo_client, port, record, client_rng, next_id)
        await trio.sleep(shutdown_after)

        async def attempt_during_drain() -> None:
            nonlocal attempt
            await server.wait_draining()
            attempt = await _attempt_connection(port)

        nursery.start_soon(attempt_during_drain)
        await bundle.shutdown(grace=grace)
    assert server.summary is not None
    stayed = Counter(r.close_code for r in records if r.leaves_at is None)
    left = Counter(r.close_code for r in records if r.leaves_at is not None)
    return DemoReport(
        clients=clients,
        shutdown_after=shutdown_after,
        grace=grace,
        requests_sent=sum(r.sent for r in records),
        answers_received=sum(r.answered for r in records),
        closed_by_server=_describe_close_codes(stayed),
        closed_by_client=_describe_close_codes(left),
        attempt_during_drain=attempt,
        server=server.statistics(),
        summary=server.summary,
    )


# -- the command line ---------------------------------------------------------


def _seconds_argument(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            return check_seconds(name, float(text))
        except ValueError as exc:
            if "must be" in str(exc):
                raise argparse.ArgumentTypeError(str(exc)) from None
            raise argparse.ArgumentTypeError(
                f"{name} must be a number of seconds, not {text!r}"
            ) from None

    return parse


def _int_argument(name: str, low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be an integer, not {text!r}"
            ) from None
        if value < low or (high is not None and value > high):
            bounds = f">= {low}" if high is None else f"from {low} to {high}"
            raise argparse.ArgumentTypeError(f"{name} must be {bounds}, not {value}")
        return value

    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line; exits with status 2 and a message on bad input."""
    parser = argparse.ArgumentParser(
        description="A WebSocket server that shuts down gracefully on SIGTERM "
        "or SIGINT: it answers the requests it has received, then sends "
        "CLOSE 1001 and waits for the client's CLOSE.",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: %(default)s)",
    )
    parser.add_argument(
        "--port",
        type=_int_argument("port", 0, 65535),
        default=8000,
        help="port to listen on; 0 picks a free one (default: %(default)s)",
    )
    parser.add_argument(
        "--grace",
        type=_seconds_argument("grace"),
        default=10.0,
        help="seconds the whole shutdown may take before the connections still "
        "open are closed at once (default: %(default)g)",
    )
    parser.add_argument(
        "--request-grace",
        type=_seconds_argument("request_grace"),
        default=20.0,
        help="seconds each connection gives its requests in flight during the "
        "shutdown; --grace still bounds it (default: %(default)g)",
    )
    parser.add_argument(
        "--log-level",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        default="INFO",
        help="how much the server logs to stderr (default: %(default)s)",
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="run the server in-process with local clients, shut it down "
        f"gracefully after {DEMO_SHUTDOWN_AFTER:g} s and print a report",
    )
    parser.add_argument(
        "--clients",
        type=_int_argument("clients", 1),
        default=20,
        help="how many clients the demo connects (default: %(default)s)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = parse_args(argv)
    logging.basicConfig(
        format="%(asctime)s %(name)s %(levelname)s: %(message)s", level=logging.WARNING
    )
    logger.setLevel(args.log_level)
    if args.demo:
        report = trio.run(
            functools.partial(
                run_demo,
                clients=args.clients,
                grace=args.grace,
                request_grace=args.request_grace,
            )
        )
        print(report)
        return 0
    return trio_graceful.run(
        serve_until_shutdown,
        args.host,
        args.port,
        args.request_grace,
        grace=args.grace,
        exit_codes=EXIT_CODES,
        # Unwinding a thousand connections takes Python the better part of a
        # second; the exit closes every socket at once.
        second_signal="exit",
        name="websocket_close_server",
    )


if __name__ == "__main__":
    sys.exit(main())
