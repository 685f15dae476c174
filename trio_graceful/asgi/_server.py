"""`serve_asgi`: an ASGI app on Hypercorn's protocols, stopped by STOP.

The sequence of one server:

1. The app's lifespan starts (Hypercorn's ``Lifespan``); then the server
   listens and reports ready with its addresses (`AsgiServer`).
2. It serves until STOP arrives in its inbox. A runner sends STOP after its
   drain delay, during which the server serves on while the health endpoint
   already says 503.
3. At STOP the listeners close, the connections in their queues are
   served, every connection is told (idle ones close once their client has
   had a moment to send another request, busy ones after their last
   response, HTTP/2 ones get GOAWAY), and so is the app (`stop_received`,
   `until_stop`...).
4. At the cut-off, a little before the hard deadline, what still runs is
   cut off: each request ends its response, and its connection closes.
5. When the last connection has closed, the lifespan shuts down, with what is
   left of the time.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Generator, Sequence
from typing import Any, cast, final

import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.typing import ASGIFramework

from .._children._threads import ThreadBudget, share_default_thread_limiter
from .._core._checks import check_count, check_seconds
from .._core._inbox import InboxReceiver
from .._core._lowlevel import NoPublicConstructor
from .._core._openbundle import open_bundle
from .._core._stop import STOP
from ._config import server_config
from ._drain import enter_drain
from ._lifespan import AppLifespan
from ._listeners import accept, listen, stop_listening
from ._serverstate import AsgiServerStatistics, ServerState
from ._shutdown import drain_server, parent_bundle

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup


@final
class AsgiServer(metaclass=NoPublicConstructor):
    """A running `serve_asgi` server: what it passes to ``task_status.started``."""

    __slots__ = ("_state", "addresses", "urls")

    def __init__(
        self,
        state: ServerState,
        urls: tuple[str, ...],
        addresses: tuple[tuple[str, int], ...],
    ) -> None:
        self._state = state
        self.urls = urls
        """The URLs the server listens on, like ``http://127.0.0.1:8000``."""
        self.addresses = addresses
        """The ``(host, port)`` of each TCP listener, in the order of ``urls``
        (a port chosen by the system when bound to port 0)."""

    def __repr__(self) -> str:
        return f"<trio_graceful.asgi.AsgiServer {' '.join(self.urls)}>"

    @property
    def thread_budget(self) -> ThreadBudget:
        """The `trio_graceful.ThreadBudget` of the server's sync endpoints.

        It shares its tokens with Trio's default thread limiter; its
        statistics count every thread that holds one, and tell which were
        abandoned.
        """
        return self._state.drain.budget

    def running_requests(self) -> list[str]:
        """Return the requests running now, as ``"GET /path"``, sorted.

        Not a checkpoint.
        """
        return self._state.running_requests()

    def statistics(self) -> AsgiServerStatistics:
        """Return an `AsgiServerStatistics` snapshot. Not a checkpoint."""
        return self._state.statistics()


async def serve_asgi(
    inbox: InboxReceiver[Any],
    app: object,
    *,
    bind: str | Sequence[str] | None = None,
    config: Config | None = None,
    reserve: float = 1.0,
    thread_tokens: int | None = None,
    task_status: trio.TaskStatus[AsgiServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve an ASGI app with Hypercorn's protocols until STOP, then drain.

    Run it as a service of `trio_graceful.run`::

        server = await runner.start_service(
            functools.partial(serve_asgi, bind="0.0.0.0:8000"), app
        )

    or as a child of any bundle, with an inbox of that bundle
    (``bundle.start(functools.partial(serve_asgi, inbox, app, bind=...))``).
    It is ready (``task_status.started``, with the `AsgiServer`) once the
    app's lifespan has started and the server listens.

    A STOP that comes while the app's lifespan starts cuts the startup
    short: nothing has been served, and `serve_asgi` returns without being
    ready. At STOP once ready: the listeners close (the connections in
    their queues are served, not reset); every request already received is answered,
    requests pipelined behind it included, and the last response on each
    HTTP/1.1 connection carries ``Connection: close``; idle keep-alive
    connections close (FIN) once their client has had a second since its
    last response to send another request, which is answered too; HTTP/2
    connections get GOAWAY and their streams finish; the app hears STOP
    (`stop_received`, `wait_stop`, `until_stop`). Whatever still runs at
    the *cut-off* (``reserve`` seconds before the hard deadline, or the last
    tenth of the time left if that is shorter) is cancelled, and its
    response ended: a 503 with ``Connection: close`` if it had not started,
    the terminating chunk of a streamed one, CLOSE 1001 for a WebSocket.
    When every connection has closed, the lifespan shuts down within the
    time left. The hard deadline is the one that bounds the calling task,
    such as the grace of the bundle whose ``shutdown`` sent STOP; without
    one, nothing is cut off.

    This is a checkpoint.

    Args:
        inbox (InboxReceiver): Where STOP arrives (a runner's service gets
            one of its own).
        app: The ASGI application.
        bind (str, list of str or None): Where to listen, in Hypercorn's
            forms (``"127.0.0.1:8000"``, ``"[::1]:0"``, ``"unix:/path"``,
            ``"fd://3"``); overrides ``config.bind``. None keeps the
            config's (Hypercorn's default is ``127.0.0.1:8000``).
        config (hypercorn.config.Config or None): Hypercorn's settings:
            TLS, timeouts, HTTP/2 limits, logging... Every field that
            applies is honoured; one that cannot be (``workers``,
            ``use_reloader``, ``graceful_timeout``, which the grace of the
            caller's shutdown replaces...) must be left at its default, and
            is refused otherwise: :ref:`asgi-config` has the table. The
            caller's config is not changed.
        reserve (float): Seconds before the hard deadline at which running
            requests are cut off, for them to end their responses and for
            the lifespan's shutdown.
        thread_tokens (int or None): How many threads the run's sync
            endpoints may use at once: the size of Trio's default thread
            limiter (what Starlette's, FastAPI's and Quart-Trio's thread
            pools use), which `sync_to_async` shares (`AsgiServer.thread_budget`).
            None leaves it as it is (40, Trio's default).
        task_status: Trio's; the server is passed to its ``started``.

    Raises:
        TypeError: if ``app`` is not callable or ``config`` is not a
            Hypercorn ``Config``.
        ValueError: if ``bind`` is empty, ``reserve`` negative,
            ``thread_tokens`` less than 1, or a field of ``config`` is
            refused (the message names it, its value and what to use
            instead); raised before anything is bound or started.
        OSError: if an address cannot be bound.
        hypercorn.utils.LifespanFailureError: if the app's lifespan startup
            failed (before the server is ready), or its shutdown.
        hypercorn.utils.LifespanTimeoutError: if the lifespan's startup took
            longer than ``config.startup_timeout``, or its shutdown longer
            than ``config.shutdown_timeout``.
    """
    reserve = check_seconds("reserve", reserve)
    if thread_tokens is not None:
        check_count("thread_tokens", thread_tokens)
    config = server_config(config, bind)
    if not callable(app):
        raise TypeError(f"app must be an ASGI app, not {app!r}")
    # Hypercorn's logger applies logconfig and opens the log files when it
    # is made: before anything starts, as Hypercorn's worker does.
    log = config.log
    try:
        await _serve(inbox, app, config, reserve, thread_tokens, task_status)
    finally:
        if isinstance(log, StatsdLogger):
            log.socket.close()  # Hypercorn's worker leaves it to the process's end


async def _serve(
    inbox: InboxReceiver[Any],
    app: object,
    config: Config,
    reserve: float,
    thread_tokens: int | None,
    task_status: trio.TaskStatus[AsgiServer],
) -> None:
    budget = share_default_thread_limiter(thread_tokens)
    state = ServerState(ASGIWrapper(cast("ASGIFramework", app)), config, budget)
    parent = parent_bundle()
    # Bound first: an address in use fails the start before the app starts.
    listeners, urls, addresses = listen(config)
    server = AsgiServer._create(state, tuple(urls), tuple(addresses))  # pyright: ignore[reportPrivateUsage]
    try:
        with _one_error():
            async with trio.open_nursery() as nursery:
                lifespan = AppLifespan(state)
                # Before the lifespan: its tasks may wait for STOP too.
                enter_drain(state.drain)
                stopped = await _start_unless_stopped(lifespan, nursery, inbox)
                if stopped is None:
                    nursery.cancel_scope.cancel()
                    return
                async with open_bundle(name="connections") as connections:
                    for listener, url in zip(listeners, server.urls, strict=True):
                        connections.start_soon(
                            accept,
                            listener,
                            connections,
                            state,
                            name=f"accept on {url}",
                        )
                    task_status.started(server)
                    while not stopped and await inbox.receive() is not STOP:
                        pass  # nothing but STOP is meant for a server
                    await drain_server(
                        state,
                        functools.partial(
                            stop_listening, listeners, connections, state
                        ),
                        reserve,
                        parent,
                    )
                await lifespan.shut_down()
                nursery.cancel_scope.cancel()
    finally:
        for listener in listeners:
            listener.close()


@contextlib.contextmanager
def _one_error() -> Generator[None]:
    """Raise the only exception of a group as itself, as a caller expects it."""
    try:
        yield
    except BaseExceptionGroup as group:
        errors = group.exceptions
        if len(errors) == 1 and not isinstance(errors[0], BaseExceptionGroup):
            raise errors[0] from None
        raise


async def _start_unless_stopped(
    lifespan: AppLifespan, nursery: trio.Nursery, inbox: InboxReceiver[Any]
) -> bool | None:
    """Start the app's lifespan; return whether STOP came meanwhile.

    A STOP that comes while the app starts (the runner sends it to a service
    still starting) cuts the startup short, and None is returned: nothing
    has been served yet, so nothing is left to drain, and a startup that
    hangs (a database that does not answer) must not hold the stop up until
    the hard deadline. This is a checkpoint.
    """
    stopped = False
    starting, watching = trio.CancelScope(), trio.CancelScope()

    async def cut_short_at_stop() -> None:
        nonlocal stopped
        with watching:
            while await inbox.receive() is not STOP:
                pass  # nothing but STOP is meant for a server
            stopped = True
            starting.cancel()

    # In the lifespan's nursery, so that the app's errors leave as they are.
    nursery.start_soon(cut_short_at_stop, name="<STOP during the startup>")
    try:
        with starting:
            await lifespan.start(nursery)
    finally:
        watching.cancel()
    if starting.cancelled_caught:
        return None
    return stopped
