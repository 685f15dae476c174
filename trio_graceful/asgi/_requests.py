"""The requests of one connection: their tasks, and how a cut-off ends them.

Hypercorn's protocols start the app through a *task group*
(``spawn_app``) and run their helpers through it (``spawn``: HTTP/2's
sender, WebSocket pings). `AppTasks` is that task group for one connection:
each request runs as a child of the connection's bundle, named by its method
and path (``GET /work``), so that the progress lines, the shutdown report,
traces and the watchdog's dump of a stuck program name it; the helpers run
in a plain nursery beside it.

Each request's ``send`` is an `Exchange`: it passes each message on to
Hypercorn's stream and remembers how far the response got (`Progress`).

At the cut-off (`AppTasks.cut`) the bundle's children are hard-cancelled. A
request task that was cut off then ends what its app left open
(`Exchange.finish`) before it unwinds: a response not yet started becomes a
503 (with ``Connection: close`` if it is the last answer on an HTTP/1.1
connection), a started one gets its last (empty) body message, which ends a
chunked response with its terminating chunk, and an accepted WebSocket gets
CLOSE 1001. That takes a few writes, so it runs shielded, but never past the
hard deadline nor for longer than `FINISH_BUDGET`. A request that cannot be
cancelled (a thread that cannot be abandoned) has its response ended by the
connection instead (`AppTasks.end_stuck`).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, cast, final

import h11
import trio
from hypercorn.config import Config
from hypercorn.typing import AppWrapper, ASGIReceiveEvent, ASGISendEvent, Scope

from .._core._bundle import Bundle
from .._core._groups import as_group, is_cancellation
from .._core._log import library_logger
from .._core._lowlevel import NoPublicConstructor

logger = library_logger("trio_graceful.asgi")

# Seconds a cut-off request may take to end its response (a 503, a
# terminating chunk, a CLOSE): a client that reads nothing cannot hold the
# shutdown, nor a second signal, for longer.
FINISH_BUDGET = 0.25
# The Retry-After of a 503 answered at the cut-off.
RETRY_AFTER = b"1"


class Progress(enum.Enum):
    """How far one request's response got."""

    WAITING = "waiting"  # nothing sent yet
    STARTED = "started"  # response headers sent (WebSocket: accepted)
    DONE = "done"  # the last body message sent (WebSocket: CLOSE sent)


# Message type -> the progress it makes; a body message is DONE only when it
# says there is no more body.
_STEPS: dict[str, Progress] = {
    "http.response.start": Progress.STARTED,
    "websocket.accept": Progress.STARTED,
    "websocket.close": Progress.DONE,
    "websocket.http.response.start": Progress.STARTED,
}


class Exchange(metaclass=NoPublicConstructor):
    """The ASGI ``send`` of one request, remembering how far the response got."""

    __slots__ = ("_send", "closed", "kind", "progress")

    def __init__(
        self, kind: str, send: Callable[[ASGISendEvent | None], Awaitable[None]]
    ) -> None:
        self.kind = kind
        self._send = send
        self.progress = Progress.WAITING
        self.closed = False

    async def send(self, message: ASGISendEvent) -> None:
        """The ``send`` callable the app gets.

        Once the stream is closed (`close_stream`), what the app still sends
        is dropped: a cut-off has answered for it.
        """
        if self.closed:
            return
        kind = message["type"]
        step = _STEPS.get(kind)
        if step is not None:
            self.progress = step
        elif kind in ("http.response.body", "websocket.http.response.body") and not (
            cast("dict[str, Any]", message).get("more_body", False)
        ):
            self.progress = Progress.DONE
        await self._send(message)

    async def refuse(self) -> None:
        """Answer 503 with ``Retry-After``.

        During a drain the HTTP/1.1 protocol adds ``Connection: close`` if it
        is the last answer of its connection; HTTP/2 forbids the header.
        """
        start = "http.response.start"
        body = "http.response.body"
        if self.kind == "websocket":
            start = "websocket.http.response.start"
            body = "websocket.http.response.body"
        await self.send(
            cast(
                "ASGISendEvent",
                {
                    "type": start,
                    "status": 503,
                    "headers": [
                        (b"content-length", b"0"),
                        (b"retry-after", RETRY_AFTER),
                    ],
                },
            )
        )
        await self.send(cast("ASGISendEvent", {"type": body, "body": b""}))

    async def finish(self) -> str:
        """End what the app left open at a cut-off; return what was done.

        Raises:
            h11.LocalProtocolError: if a response with a ``Content-Length``
                was cut before all of its body went out; only closing the
                connection can end it.
        """
        if self.progress is Progress.WAITING:
            await self.refuse()
            return "refused with 503"
        if self.kind == "websocket":
            await self.send(
                cast(
                    "ASGISendEvent",
                    {"type": "websocket.close", "code": 1001, "reason": "shutdown"},
                )
            )
            return "closed with 1001"
        await self.send(
            cast(
                "ASGISendEvent",
                {"type": "http.response.body", "body": b"", "more_body": False},
            )
        )
        return "response ended"

    async def close_stream(self) -> None:
        """Tell Hypercorn's stream that the app has finished (``send(None)``), once."""
        if not self.closed:
            self.closed = True
            await self._send(None)


class CutOff(Protocol):
    """What the request tasks ask their connection and server."""

    @property
    def cut_off(self) -> bool:
        """True once the connection's requests have been cut off."""
        ...

    @property
    def hard_deadline(self) -> float:
        """The server's hard deadline (Trio time); `math.inf` before STOP."""
        ...

    def request_cut(self, name: str, what: str) -> None:
        """Record a request that was cut off; ``what`` says how it ended."""

    def abort(self) -> None:
        """Close the connection without ending the response in progress."""


def request_name(scope: Scope) -> str:
    """Return how a request is named: ``GET /path`` or ``WebSocket /path``."""
    if scope["type"] == "http":
        return f"{scope['method']} {scope['path']}"
    if scope["type"] == "websocket":
        return f"WebSocket {scope['path']}"
    return scope["type"]


def _is_app_error(exc: BaseException) -> bool:
    """Tell whether ``exc``, Cancelled left aside, holds only `Exception` s."""
    group = as_group(exc)
    if group is not None:
        return isinstance(group.split(trio.Cancelled)[1], Exception)
    return isinstance(exc, Exception)


@final
class AppTasks:
    """Hypercorn's task group for one connection (see the module docstring)."""

    def __init__(self, apps: Bundle, helpers: trio.Nursery, owner: CutOff) -> None:
        self._apps = apps
        self._helpers = helpers
        self._owner = owner
        # The requests whose app runs and whose response nobody is ending yet.
        self._running: dict[Exchange, str] = {}

    async def spawn_app(
        self,
        app: AppWrapper,
        config: Config,
        scope: Scope,
        send: Callable[[ASGISendEvent | None], Awaitable[None]],
    ) -> Callable[[ASGIReceiveEvent], Awaitable[None]]:
        """Start the app for one request; return the callable that feeds it."""
        to_app, from_server = trio.open_memory_channel[ASGIReceiveEvent](
            config.max_app_queue_size
        )
        exchange = Exchange._create(  # pyright: ignore[reportPrivateUsage]
            scope["type"], send
        )
        name = request_name(scope)
        if self._owner.cut_off:
            # Pipelined behind a request that was cut off: answered, not run
            # (the requests' bundle has closed).
            self._helpers.start_soon(self._finish, exchange, name, name=name)
        else:
            self._running[exchange] = name
            self._apps.start_soon(
                self._run, app, config, scope, from_server.receive, exchange, name=name
            )
        return to_app.send

    @property
    def running(self) -> frozenset[trio.lowlevel.Task]:
        """The tasks of the requests running now."""
        return self._apps.child_tasks

    async def cut(self) -> None:
        """Cancel the requests; return when their responses have been ended.

        Those that do not end within twice `FINISH_BUDGET` (or half the time
        left before the hard deadline, if less) are ended without their tasks
        (`end_stuck`). This is a checkpoint.
        """
        if not self._apps.closed:
            now = trio.current_time()
            left = self._owner.hard_deadline - now
            with trio.move_on_at(now + min(2 * FINISH_BUDGET, left / 2)):
                await self._apps.cancel(0)
        await self.end_stuck()

    def spawn(self, func: Callable[..., Awaitable[object]], *args: Any) -> None:
        """Run one of the protocol's helpers beside the requests."""
        self._helpers.start_soon(func, *args)

    async def _run(
        self,
        app: AppWrapper,
        config: Config,
        scope: Scope,
        receive: Callable[[], Awaitable[ASGIReceiveEvent]],
        exchange: Exchange,
    ) -> None:
        try:
            await app(
                scope,
                cast("Any", receive),
                exchange.send,
                trio.to_thread.run_sync,
                trio.from_thread.run,
            )
        except BaseException as exc:
            name = self._running.pop(exchange, None)
            if is_cancellation(exc):
                if self._owner.cut_off and name is not None:
                    await self._finish(exchange, name)
                raise
            if not _is_app_error(exc):
                raise
            # As Hypercorn does: logged, and answered with a 500 if nothing
            # was sent yet.
            await config.log.exception("Error in ASGI Framework")
        self._running.pop(exchange, None)
        await exchange.close_stream()

    async def end_stuck(self) -> None:
        """End the responses of the requests a cut-off could not cancel.

        A request waits in a thread that cannot be abandoned, say (a ``def``
        endpoint of Starlette or Quart): its task runs on until the thread
        returns, but its client gets its answer now. This is a checkpoint.
        """
        stuck, self._running = self._running, {}
        for exchange, name in stuck.items():
            logger.warning(
                "%s did not end when it was cut off: it waits for something that "
                "cannot be cancelled, such as a thread of a def endpoint (wrap "
                "it with trio_graceful.asgi.sync_to_async); its response is "
                "ended without it",
                name,
            )
            await self._finish(exchange, name)
        await trio.lowlevel.checkpoint()

    async def _finish(self, exchange: Exchange, name: str) -> None:
        owner = self._owner
        if exchange.progress is Progress.DONE:
            # Its answer was complete: the client lost nothing.
            await exchange.close_stream()
            return
        deadline = min(owner.hard_deadline, trio.current_time() + FINISH_BUDGET)
        what = "not ended: the deadline came first"
        with trio.CancelScope(shield=True, deadline=deadline):
            try:
                what = await exchange.finish()
            except h11.LocalProtocolError:
                # A Content-Length response cut in the middle of its body:
                # only closing the connection tells the client.
                what = "cut in the middle of its body; connection closed"
                owner.abort()
            await exchange.close_stream()
        owner.request_cut(name, what)
