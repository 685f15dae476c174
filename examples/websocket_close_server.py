"""A WebSocket server that shuts down gracefully and answers everything it reads.

The protocol: a client sends text messages ``{"id": <int>, "work_ms": <int>}``;
the server works on each for ``work_ms`` milliseconds and answers
``{"id": <int>}``. Requests may be pipelined: a connection works on them
concurrently and answers them as they finish. Whatever is not such a request
gets an error reply ``{"error": "...", "id": ...}``; a binary message gets
CLOSE 1003 once the requests in flight are answered. With ``--echo`` the server
echoes every text and binary message instead (for the Autobahn TestSuite).

On SIGTERM or SIGINT it shuts down gracefully (with ``--drain-delay S``, it
first goes on serving for S seconds while its ``/readyz`` on ``--health-port``
says it is not ready, so that a load balancer can stop sending it connections):

1. It stops accepting at once: the listening sockets are closed.
2. Every request it reads gets a reply with its id, also those that come
   in during the shutdown: they are processed (by default), or refused at
   once with ``{"id": N, "error": "shutting down"}`` (``--reject-during-drain``)
   so that the client can retry elsewhere. ``--request-grace`` bounds the
   work; what is still running then is refused the same way.
3. A connection sends CLOSE 1001 as soon as it has no request in flight, waits
   for the client's CLOSE and closes TCP. Only frames that arrive after its
   CLOSE are dropped, as RFC 6455 (section 1.4) allows: the client was told.
4. ``--grace`` bounds it all: the requests are refused in time for the close
   handshakes (in the last tenth of the grace), and connections still open
   at its end are closed at once. A second signal exits at once.

A client that sends CLOSE gets its CLOSE back at once, also during the
shutdown. Run it::

    python examples/websocket_close_server.py --port 8000

and try ``python -m websockets ws://127.0.0.1:8000/``: send
``{"id": 1, "work_ms": 5000}`` and press Ctrl+C in the server's terminal. The
answer arrives, then CLOSE 1001. ``examples/websocket_demo.py`` (or ``--demo``)
shows the shutdown with many clients, next to a naive one.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import logging
import math
import os
import signal
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeGuard, cast

import attrs
import trio
from websocket_connection import (
    ConnectionClosed,
    Message,
    WebSocket,
    accept_websocket,
)

import trio_graceful
from trio_graceful import STOP, StopType

logger = logging.getLogger("websocket_close_server")

GOING_AWAY = (1001, "the server is shutting down")
UNSUPPORTED = (1003, "this server accepts text messages only")
MAX_WORK_MS = 3_600_000
"""The longest work a request may ask for: one hour."""
MAX_MESSAGE = 2**20
"""The largest message, in bytes, that a request may be (16 MiB with --echo:
the Autobahn TestSuite sends that much)."""
HANDSHAKE_TIMEOUT = 10.0
"""Seconds a new TCP connection has to complete the WebSocket opening handshake."""


class InvalidRequest(ValueError):
    """A text message that is not a valid request; it gets an error reply."""

    def __init__(self, message: str, request_id: int | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _parse_int(digits: str) -> int:
    if len(digits.lstrip("-")) > 100:
        raise InvalidRequest("request has a number longer than 100 digits")
    return int(digits)


_DECODER = json.JSONDecoder(parse_int=_parse_int)


def parse_request(text: str) -> tuple[int, int]:
    """Return ``(id, work_ms)``; keys other than those two are ignored.

    Raises:
        InvalidRequest: if ``text`` is not a JSON object with an integer ``id``
            and an integer ``work_ms`` from 0 to `MAX_WORK_MS`.
    """
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise InvalidRequest("request is not valid JSON: it nests too deeply") from None
    except InvalidRequest:
        raise
    except ValueError as exc:
        raise InvalidRequest(f"request is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidRequest(
            'request must be a JSON object {"id": <int>, "work_ms": <int>}, '
            f"not {_show(value)}"
        )
    value = cast("dict[str, object]", value)
    if "id" not in value:
        raise InvalidRequest("request must have an id")
    request_id = value["id"]
    if not _is_int(request_id):
        raise InvalidRequest(f"id must be an integer, not {_show(request_id)}")
    work_ms = value.get("work_ms")
    if work_ms is None:
        raise InvalidRequest("request must have a work_ms", request_id)
    if not (_is_int(work_ms) and 0 <= work_ms <= MAX_WORK_MS):
        raise InvalidRequest(
            f"work_ms must be an integer from 0 to {MAX_WORK_MS}, not {_show(work_ms)}",
            request_id,
        )
    return request_id, work_ms


def check_seconds(name: str, value: float) -> float:
    """Return ``value`` as seconds >= 0 (`math.inf` is fine), else raise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"{name} must be a number, not {value!r}")
    if not value >= 0:  # also catches NaN
        raise ValueError(f"{name} must be >= 0, not {value!r}")
    return float(value)


def _check_request_grace(value: float) -> float:
    return check_seconds("request_grace", value)


@attrs.define
class ServerStatistics:
    """What a `WorkServer` has done so far, each thing counted once."""

    connections_accepted: int = 0
    connections_open: int = 0
    closed_gracefully: int = 0
    """Connections that ended after a close handshake (either side's CLOSE)."""
    hard_closed: int = 0
    """Connections closed without a handshake: a grace ran out, or it broke."""
    requests_read: int = 0
    answered: int = 0
    """Requests whose work was done and answered ``{"id": N}``."""
    refused: int = 0
    """Requests answered ``{"id": N, "error": "shutting down"}``."""
    lost: int = 0
    """Requests left without a reply because their client closed first, or the
    outer grace closed the connection."""
    malformed: int = 0
    """Messages that were not requests: error replies, CLOSE 1003."""
    draining_since: float | None = None
    """When the shutdown began (Trio time), or None."""

    def summary(self) -> str:
        """The one-line log entry of a shutdown."""
        return (
            f"shutdown: {self.closed_gracefully} connections closed gracefully, "
            f"{self.hard_closed} hard-closed; requests read: {self.requests_read} "
            f"= {self.answered} answered + {self.refused} refused + {self.lost} lost"
        )


@attrs.define(eq=False)
class _Requests:
    """One connection's requests: at most ``limit`` worked on, the rest waiting.

    The work runs in ``nursery``, whose deadline is the cut-off: a request
    cut off keeps its place here, so that the connection refuses it.
    """

    nursery: trio.Nursery
    work: Callable[[_Requests, int, int, int], Awaitable[None]]
    limit: int
    running: dict[int, int] = attrs.field(factory=dict[int, int])
    """Token -> id of each request being worked on."""
    waiting: deque[tuple[int, int]] = attrs.field(factory=deque[tuple[int, int]])
    _tokens: Iterator[int] = attrs.field(factory=itertools.count)
    _slot_freed: trio.Event | None = None
    _until_idle: trio.CancelScope | None = None

    @property
    def full(self) -> bool:
        return len(self.running) + len(self.waiting) >= self.limit

    def add(self, request_id: int, work_ms: int) -> None:
        if len(self.running) < self.limit:
            token = next(self._tokens)
            self.running[token] = request_id
            self.nursery.start_soon(self.work, self, token, request_id, work_ms)
        else:
            self.waiting.append((request_id, work_ms))

    def finish(self, token: int) -> None:
        del self.running[token]
        if self.waiting:
            self.add(*self.waiting.popleft())
        if self._slot_freed is not None and not self.full:
            self._slot_freed.set()
        if not self.running and self._until_idle is not None:
            self._until_idle.cancel()

    def give_up(self) -> list[int]:
        """Forget every request still here; return their ids."""
        ids = [*self.running.values(), *(request_id for request_id, _ in self.waiting)]
        self.running.clear()
        self.waiting.clear()
        return ids

    async def wait_for_a_slot(self) -> None:
        while self.full:
            self._slot_freed = trio.Event()
            await self._slot_freed.wait()
        self._slot_freed = None

    async def run_until_idle(
        self, receive: Callable[[], Awaitable[list[Message]]]
    ) -> list[Message] | None:
        """Run a cancel-safe ``receive``; None if nothing was, or is, in flight."""
        with trio.CancelScope() as self._until_idle:
            if self.running:
                return await receive()
        return None


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
        if not (_is_int(self.max_in_flight) and self.max_in_flight >= 1):
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
                    handler_nursery=cast(trio.Nursery, connections),
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
        async with stream:
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
        requests: _Requests | None = None
        graceful = False
        try:
            close: tuple[int, str] | None = GOING_AWAY  # unless _converse returns
            async with trio.open_nursery() as nursery:
                requests = _Requests(
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
        requests: _Requests,
    ) -> tuple[int, str] | None:
        """Read and answer until the server decides to close; return its CLOSE.

        Returns None if the client closed first. A message read is handled
        at once, with no checkpoint (`_take`), so no cancellation can lose it.
        """
        close: tuple[int, str] | None = None
        refuse = False
        try:
            while True:
                received: list[Message] | StopType | None
                if close is None:
                    # Idle points, which STOP ends: a cancelled receive has
                    # read nothing. With max_in_flight requests, a slot first.
                    wait = requests.wait_for_a_slot if requests.full else ws.receive
                    received = await inbox.until_stop(wait)
                    if received is STOP:
                        close, refuse = GOING_AWAY, self.reject_during_drain
                        requests.nursery.cancel_scope.deadline = self._work_deadline()
                        continue
                else:
                    received = await requests.run_until_idle(ws.receive)
                    if received is None:  # nothing in flight
                        if not ws.readable_now():
                            return close  # and nothing unread: CLOSE now
                        received = await ws.receive()
                for message in received or ():
                    if not self._take(ws, message, requests, refuse):
                        close = close or UNSUPPORTED
                await ws.flush()  # replies, PONGs
        except ConnectionClosed as exc:
            logger.debug("%s: closed by the client: %s", ws, exc)
            requests.nursery.cancel_scope.cancel()  # no reply can be sent now
            return None

    def _work_deadline(self) -> float:
        # The outer grace wins; its last tenth is kept for refusals and CLOSEs.
        now = trio.current_time()
        outer = trio.current_effective_deadline()
        return min(now + self.request_grace, outer - (outer - now) / 10)

    async def _refuse_the_rest(self, ws: WebSocket, requests: _Requests) -> None:
        """Refuse the requests cut off, waiting, or already sent to us."""
        for request_id in requests.give_up():
            self._reply(ws, request_id, refused=True)
        while ws.readable_now():
            for message in await ws.receive():
                self._take(ws, message, requests, refuse=True)

    def _take(
        self, ws: WebSocket, message: Message, requests: _Requests, refuse: bool
    ) -> bool:
        """Handle a message read; return False if it asks for CLOSE 1003."""
        if self.echo:
            with contextlib.suppress(ConnectionClosed):  # read with the CLOSE
                ws.send_nowait(message)
            return True
        if isinstance(message, bytes):
            self._stats.malformed += 1
            return False
        try:
            request_id, work_ms = parse_request(message)
        except InvalidRequest as exc:
            self._stats.malformed += 1
            logger.info("%s: %s", ws, exc)
            with contextlib.suppress(ConnectionClosed):
                ws.send_nowait(_error(exc.request_id, str(exc)))
            return True
        self._stats.requests_read += 1
        logger.debug("%s: received request %d (%d ms)", ws, request_id, work_ms)
        if refuse:
            self._reply(ws, request_id, refused=True)
        else:
            requests.add(request_id, work_ms)
        return True

    async def _work(
        self,
        ws: WebSocket,
        requests: _Requests,
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
                ws.send_nowait(_error(request_id, "shutting down"))
            else:
                ws.send_nowait(f'{{"id": {request_id}}}')
        except ConnectionClosed:
            self._stats.lost += 1
        else:
            if refused:
                self._stats.refused += 1
            else:
                self._stats.answered += 1


def _error(request_id: int | None, message: str) -> str:
    if request_id is None:
        return json.dumps({"error": message})
    return json.dumps({"id": request_id, "error": message})


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


def _seconds(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            return check_seconds(name, float(text))
        except ValueError as exc:
            message = str(exc) if "must be" in str(exc) else None
            raise argparse.ArgumentTypeError(
                message or f"{name} must be a number of seconds, not {text!r}"
            ) from None

    return parse


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
        "--grace",
        type=_seconds("grace"),
        default=10.0,
        help="seconds the whole shutdown may take (default: %(default)g)",
    )
    add(
        "--request-grace",
        type=_seconds("request_grace"),
        default=20.0,
        help="seconds of work the requests get in the shutdown (default: %(default)g)",
    )
    add(
        "--reject-during-drain",
        action="store_true",
        help="refuse the requests "
        "read during the shutdown at once instead of processing them",
    )
    add(
        "--drain-delay",
        type=_seconds("drain_delay"),
        default=0.0,
        help="seconds to go on serving, not ready, after the signal (default: 0)",
    )
    add(
        "--stop-budget",
        type=_seconds("stop_budget"),
        default=math.inf,
        help="seconds the orchestrator allows before SIGKILL (default: no limit)",
    )
    add("--health-port", type=_port, help="serve /readyz, /livez and /statusz here")
    add("--echo", action="store_true", help="echo every message instead")
    add("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], default="INFO")
    add("--demo", action="store_true", help="run examples/websocket_demo.py")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--demo" in argv:  # the demo lives next door; it starts this server
        demo = Path(__file__).with_name("websocket_demo.py")
        os.execv(sys.executable, [sys.executable, str(demo), *argv])
    args = parse_args(argv)
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
        grace=args.grace,
        drain_delay=args.drain_delay,
        stop_budget=args.stop_budget,
        health_port=args.health_port,
        health_host=None if args.health_port is None else args.host,
        exit_codes=EXIT_CODES,
        second_signal="exit",  # exiting closes every socket at once
        name="websocket_close_server",
    )


if __name__ == "__main__":
    sys.exit(main())
