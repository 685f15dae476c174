"""A WebSocket server that shuts down gracefully and answers everything it reads.

Clients send requests ``{"id": <int>, "work_ms": <int>}``, pipelined; each is
worked on for ``work_ms`` ms and answered ``{"id": <int>}``
(``websocket_requests.py``). With ``--echo`` every message is echoed instead.
On SIGTERM or SIGINT (after ``--drain-delay`` seconds of serving while
``/readyz`` says it is not ready, if asked):

1. The listeners close at once: new connections are refused.
2. Every request read gets a reply with its id, also those read during the
   shutdown: they are worked on, or, with ``--reject-during-drain``, refused
   at once with ``{"id": N, "error": "shutting down"}`` so that the client
   can retry elsewhere. ``--request-grace`` bounds the work; what is cut off
   is refused the same way.
3. A connection sends CLOSE 1001 once nothing is in flight or unread, waits
   for the client's CLOSE and closes TCP. Only frames that come after its
   CLOSE are dropped, as RFC 6455 allows: the client was told.
4. ``--grace`` bounds it all; its last tenth is kept for the refusals and
   close handshakes. A second signal exits at once.

Run ``python examples/websocket_close_server.py --port 8000``, connect with
``python -m websockets ws://127.0.0.1:8000/``, send
``{"id": 1, "work_ms": 5000}`` and press Ctrl+C in the server's terminal: the
answer comes, then CLOSE 1001. ``--demo`` (``websocket_demo.py``) shows it
with many clients, next to a naive shutdown.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import math
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import attrs
import trio
from websocket_connection import (
    ConnectionClosed,
    Message,
    WebSocket,
    accept_websocket,
)
from websocket_requests import (
    InvalidRequest,
    Requests,
    ServerStatistics,
    answer,
    error_reply,
    is_int,
    parse_request,
)

import trio_graceful
from trio_graceful import STOP

logger = logging.getLogger("websocket_close_server")

GOING_AWAY = (1001, "the server is shutting down")
UNSUPPORTED = (1003, "this server accepts text messages only")
MAX_MESSAGE = 2**20
"""The largest message, in bytes, that a request may be (16 MiB with --echo:
the Autobahn TestSuite sends that much)."""
HANDSHAKE_TIMEOUT = 10.0
"""Seconds a new TCP connection has to complete the WebSocket opening handshake."""


def check_seconds(name: str, value: float) -> float:
    """Return ``value`` as seconds >= 0 (`math.inf` is fine), else raise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"{name} must be a number, not {value!r}")
    if not value >= 0:  # also catches NaN
        raise ValueError(f"{name} must be >= 0, not {value!r}")
    return float(value)


def _check_request_grace(value: float) -> float:
    return check_seconds("request_grace", value)


@attrs.define(eq=False)
class WorkServer:
    """The server. Run `serve` in a bundle; shut the bundle down to stop it."""

    request_grace: float = attrs.field(
        default=20.0,
        kw_only=True,
        converter=_check_request_grace,
    )
    """Seconds the requests get once the shutdown begins (--grace still bounds it)."""
    reject_during_drain: bool = attrs.field(default=False, kw_only=True)
    """Refuse the requests read during the shutdown instead of processing them."""
    echo: bool = attrs.field(default=False, kw_only=True)
    """Echo every message instead of treating it as a request."""
    max_in_flight: int = attrs.field(default=1000, kw_only=True)
    """Requests a connection works on at once; more wait, and it stops reading."""
    _connections: trio_graceful.Bundle | None = attrs.field(default=None, init=False)
    _stats: ServerStatistics = attrs.field(factory=ServerStatistics, init=False)
    _draining: trio.Event = attrs.field(factory=trio.Event, init=False)

    def __attrs_post_init__(self) -> None:
        if not (is_int(self.max_in_flight) and self.max_in_flight >= 1):
            raise ValueError(
                f"max_in_flight must be an integer >= 1, not {self.max_in_flight!r}"
            )

    def statistics(self) -> ServerStatistics:
        """Return a copy of what the server has done so far."""
        return attrs.evolve(self._stats)

    async def wait_draining(self) -> None:
        """Return once the server has stopped accepting."""
        await self._draining.wait()

    async def serve(
        self,
        inbox: trio_graceful.InboxReceiver[object],
        listeners: Sequence[trio.SocketListener],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve on ``listeners`` until STOP comes in ``inbox``, then drain.

        Closes the listeners at once and shuts every connection down, with no
        deadline of its own: the grace of the bundle that runs it bounds it.
        """
        try:
            async with trio_graceful.open_bundle(name="connections") as connections:
                self._connections = connections
                serve = functools.partial(
                    trio.serve_listeners,
                    self._serve_tcp,
                    list(listeners),
                    # a Bundle stands in for a Nursery
                    handler_nursery=connections.as_nursery(),
                )
                task_status.started()
                # Cancelling serve_listeners closes the listeners, nothing else.
                await inbox.until_stop(serve)
                self._stats.draining_since = trio.current_time()
                self._draining.set()
                logger.info(
                    "stopped accepting; closing %d connections",
                    self._stats.connections_open,
                )
                await connections.shutdown(grace=math.inf)
        finally:
            if self._stats.draining_since is not None:
                elapsed = trio.current_time() - self._stats.draining_since
                logger.info("%s; done in %.3f s", self._stats.summary(), elapsed)

    async def _serve_tcp(self, stream: trio.SocketStream) -> None:
        assert self._connections is not None
        _, inbox = self._connections.open_inbox()
        max_message = 2**24 if self.echo else MAX_MESSAGE
        accept = functools.partial(accept_websocket, max_message=max_message)
        # trio.serve_listeners closes the stream when this returns.
        with inbox:
            ws: object = None
            with trio.move_on_after(HANDSHAKE_TIMEOUT):
                # The opening handshake is an idle point: STOP ends it.
                ws = await inbox.until_stop(accept, stream)
            if isinstance(ws, WebSocket):
                await self._serve_websocket(ws, inbox)

    async def _serve_websocket(
        self, ws: WebSocket, inbox: trio_graceful.InboxReceiver[object]
    ) -> None:
        stats = self._stats
        stats.connections_accepted += 1
        stats.connections_open += 1
        logger.debug("%s: connected", ws)
        requests: Requests | None = None
        graceful = False
        try:
            close: tuple[int, str] | None = GOING_AWAY  # unless _converse returns
            async with trio.open_nursery() as nursery:
                requests = Requests(
                    nursery, functools.partial(self._work, ws), self.max_in_flight
                )
                close = await self._converse(ws, inbox, requests)
            if close is not None:
                if nursery.cancel_scope.cancelled_caught:  # the work was cut off
                    await self._refuse_the_rest(ws, requests)
                logger.debug("%s: sending CLOSE %d", ws, close[0])
                await ws.aclose(*close)
            graceful = ws.close_code != 1006
        except ConnectionClosed as exc:
            logger.debug("%s: closed by the client: %s", ws, exc)
            graceful = exc.code != 1006
        finally:
            stats.connections_open -= 1
            if graceful:
                stats.closed_gracefully += 1
            else:
                stats.hard_closed += 1
            if requests is not None:  # left without a reply
                stats.lost += len(requests.give_up())

    async def _converse(
        self,
        ws: WebSocket,
        inbox: trio_graceful.InboxReceiver[object],
        requests: Requests,
    ) -> tuple[int, str] | None:
        """Read and answer until the server decides to close; return its CLOSE.

        Returns None if the client closed first.
        """
        try:
            # Serving is an idle point as a whole, which STOP ends: each of
            # its checkpoints is cancel-safe (see _serve_requests).
            close = await inbox.until_stop(self._serve_requests, ws, requests)
            refuse = False
            if close is STOP:
                close, refuse = GOING_AWAY, self.reject_during_drain
                requests.nursery.cancel_scope.deadline = self._work_deadline()
            while True:  # answer what comes until nothing is in flight or unread
                received = await requests.run_until_idle(ws.receive)
                if received is None:  # nothing in flight
                    if not ws.readable_now():
                        return close  # and nothing unread: CLOSE now
                    received = await ws.receive()
                self._take_all(ws, received, requests, refuse)
                await ws.flush()  # replies, PONGs
        except ConnectionClosed as exc:
            logger.debug("%s: closed by the client: %s", ws, exc)
            requests.nursery.cancel_scope.cancel()  # no reply can be sent now
            return None

    async def _serve_requests(
        self, ws: WebSocket, requests: Requests
    ) -> tuple[int, str]:
        """Read and take requests until a binary message; return CLOSE 1003.

        Its checkpoints are cancel-safe: a cancelled receive has read
        nothing, a cancelled flush keeps what it did not send, and what a
        read brings is taken at once (`_take_all`), with no checkpoint, so a
        cancellation never falls between reading a request and taking it.
        """
        while True:
            if requests.full:
                await requests.wait_for_a_slot()  # backpressure: read no more
            received = await ws.receive()
            unsupported = self._take_all(ws, received, requests, refuse=False)
            await ws.flush()  # replies, PONGs
            if unsupported:
                return UNSUPPORTED

    def _work_deadline(self) -> float:
        # The outer grace wins; its last tenth is kept for refusals and CLOSEs.
        now = trio.current_time()
        outer = trio.current_effective_deadline()
        return min(now + self.request_grace, outer - (outer - now) / 10)

    async def _refuse_the_rest(self, ws: WebSocket, requests: Requests) -> None:
        """Refuse the requests cut off, waiting, or already sent to us."""
        for request_id in requests.give_up():
            self._reply(ws, request_id, refused=True)
        while ws.readable_now():
            self._take_all(ws, await ws.receive(), requests, refuse=True)

    def _take_all(
        self, ws: WebSocket, received: list[Message], requests: Requests, refuse: bool
    ) -> bool:
        """Handle the messages of a read; return True if one asks for CLOSE 1003."""
        unsupported = False
        for message in received:
            unsupported |= self._take(ws, message, requests, refuse)
        return unsupported

    def _take(
        self, ws: WebSocket, message: Message, requests: Requests, refuse: bool
    ) -> bool:
        """Handle a message read; return True if it asks for CLOSE 1003."""
        if self.echo:
            with contextlib.suppress(ConnectionClosed):  # read with the CLOSE
                ws.send_nowait(message)
            return False
        if isinstance(message, bytes):
            self._stats.malformed += 1
            return True
        try:
            request_id, work_ms = parse_request(message)
        except InvalidRequest as exc:
            self._stats.malformed += 1
            logger.info("%s: %s", ws, exc)
            with contextlib.suppress(ConnectionClosed):
                ws.send_nowait(error_reply(exc.request_id, str(exc)))
            return False
        self._stats.requests_read += 1
        logger.debug("%s: received request %d (%d ms)", ws, request_id, work_ms)
        if refuse:
            self._reply(ws, request_id, refused=True)
        else:
            requests.add(request_id, work_ms)
        return False

    async def _work(
        self,
        ws: WebSocket,
        requests: Requests,
        token: int,
        request_id: int,
        work_ms: int,
    ) -> None:
        await trio.sleep(work_ms / 1000)  # the simulated work
        self._reply(ws, request_id, refused=False)
        requests.finish(token)  # after the reply is queued: it goes before CLOSE
        await ws.flush(wait=False)

    def _reply(self, ws: WebSocket, request_id: int, *, refused: bool) -> None:
        """Queue the answer or the refusal, or count the request as lost."""
        try:
            if refused:
                ws.send_nowait(error_reply(request_id, "shutting down"))
            else:
                ws.send_nowait(answer(request_id))
        except ConnectionClosed:
            self._stats.lost += 1
        else:
            if refused:
                self._stats.refused += 1
            else:
                self._stats.answered += 1


# -- running it ---------------------------------------------------------------

EXIT_CODES = trio_graceful.ExitCodes(
    clean_signals=frozenset({signal.SIGINT, signal.SIGTERM}), clean_after_grace=True
)
"""Exit 0 after a graceful shutdown, whichever signal asked."""


def url_of(listener: trio.SocketListener) -> str:
    """Return the ``ws://`` URL a listener serves."""
    host, port = listener.socket.getsockname()[:2]
    return f"ws://[{host}]:{port}/" if ":" in host else f"ws://{host}:{port}/"


async def serve_until_shutdown(
    host: str,
    port: int,
    server: WorkServer,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The ``main`` of `trio_graceful.run`: ready once it listens; STOP comes here."""
    try:
        listeners = await trio.open_tcp_listeners(port, host=host, backlog=4096)
    except OSError as exc:
        logger.error("cannot listen on %s port %d: %s", host, port, exc)
        raise SystemExit(1) from None
    runner = trio_graceful.current_runner()
    _, inbox = runner.root.open_inbox()
    logger.info("listening on %s", " ".join(map(url_of, listeners)))
    if runner.health_address is not None:
        logger.info("health endpoint on http://%s:%d/", *runner.health_address)
    await server.serve(inbox, listeners, task_status=task_status)


def _request_grace(text: str) -> float:
    try:
        return check_seconds("request_grace", float(text))
    except ValueError as exc:
        message = str(exc) if "must be" in str(exc) else None
        raise argparse.ArgumentTypeError(
            message or f"request_grace must be a number of seconds, not {text!r}"
        ) from None


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"port must be from 0 to 65535, not {text!r}")
    return int(text)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line; exit with status 2 and a message on bad input."""
    parser = argparse.ArgumentParser(
        description="A WebSocket server that shuts down gracefully."
    )
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="address (default: %(default)s)")
    add("--port", type=_port, default=8000, help="0 picks one (default: %(default)s)")
    add(
        "--request-grace",
        type=_request_grace,
        default=20.0,
        help="seconds of work the requests get in the shutdown (default: %(default)g)",
    )
    add(
        "--reject-during-drain",
        action="store_true",
        help="refuse the requests read during the shutdown instead of processing them",
    )
    add("--echo", action="store_true", help="echo every message instead")
    add("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], default="INFO")
    add("--demo", action="store_true", help="run examples/websocket_demo.py")
    trio_graceful.add_run_arguments(parser)  # --grace, --drain-delay, --health-port...
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--demo" in argv:  # the demo lives next door; it starts this server
        demo = Path(__file__).with_name("websocket_demo.py")
        os.execv(sys.executable, [sys.executable, str(demo), *argv])
    args = parse_args(argv)
    if args.health_port is not None and args.health_host is None:
        args.health_host = args.host  # next to the server, not everywhere
    logging.basicConfig(
        format="%(asctime)s %(name)s %(levelname)s: %(message)s", level=logging.WARNING
    )
    logger.setLevel(args.log_level)
    server = WorkServer(
        request_grace=args.request_grace,
        reject_during_drain=args.reject_during_drain,
        echo=args.echo,
    )
    return trio_graceful.run(
        serve_until_shutdown,
        args.host,
        args.port,
        server,
        **trio_graceful.run_arguments(args),
        exit_codes=EXIT_CODES,
        second_signal="exit",  # exiting closes every socket at once
        name="websocket_close_server",
    )


if __name__ == "__main__":
    sys.exit(main())
