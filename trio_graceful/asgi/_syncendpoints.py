"""`sync_to_async`: a blocking endpoint in a thread that a shutdown can leave.

Starlette and FastAPI run a ``def`` endpoint with anyio's
``to_thread.run_sync``, and Quart-Trio its ``run_sync``, both without
``abandon_on_cancel``: a request whose thread blocks cannot be cancelled,
so it holds the shutdown until the thread returns, past any deadline. A
function wrapped with `sync_to_async` runs in a thread of the server's
budget instead (`serve_asgi`'s ``thread_tokens``, shared with Trio's default
thread limiter, which those frameworks use), and when its request is cut
off, the request stops waiting: the thread is *abandoned*, counted and
logged, and runs on until it returns, holding its token.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar, cast

from .._children._threads import StopFlag, call_in_thread
from .._core._log import library_logger
from .._core._lowlevel import is_async_def
from ._drain import current_drain

P = ParamSpec("P")
R = TypeVar("R")

logger = library_logger("trio_graceful.asgi")


def sync_to_async(sync_fn: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """Wrap a blocking function so that a request runs it in an abandonable thread.

    Use it on a Starlette or FastAPI endpoint written with ``def``
    (``Route("/report", sync_to_async(report))``), or to run a blocking
    call from an ``async def`` handler
    (``await sync_to_async(render)(data)``), and in Quart-Trio as the app's
    ``sync_to_async`` method, which Quart uses for every sync view::

        class App(QuartTrio):
            def sync_to_async(self, func):
                return trio_graceful.asgi.sync_to_async(func)

    The call takes a token of the server's thread budget (waiting for one,
    cancellably). In the thread, `current_stop_flag` tells that the server
    got STOP. If the request is cut off while the thread runs, the request
    ends at once (its response is ended as any cut-off request's) and the
    thread is abandoned: it runs on, keeps its token until it returns, is
    counted in `AsgiServerStatistics.threads_abandoned` and logged. The
    wrapper is a checkpoint.

    Args:
        sync_fn: A synchronous function.

    Returns:
        An async function with the same arguments; it must be called from a
        request served by `serve_asgi`.

    Raises:
        TypeError: if ``sync_fn`` is not a synchronous function.
    """
    if not callable(cast("object", sync_fn)) or is_async_def(sync_fn):
        raise TypeError(f"sync_fn must be a synchronous function, not {sync_fn!r}")
    name = str(getattr(sync_fn, "__qualname__", None) or repr(sync_fn))

    @functools.wraps(sync_fn)
    async def in_thread(*args: P.args, **kwargs: P.kwargs) -> R:
        drain = current_drain("sync_to_async")

        def call(flag: StopFlag) -> R:
            del flag  # the function reads current_stop_flag() if it cares
            return sync_fn(*args, **kwargs)

        def abandoned() -> None:
            drain.threads_abandoned.append(name)
            logger.warning(
                "thread %r abandoned: its request was cut off; it runs on", name
            )

        return await call_in_thread(
            call,
            name=name,
            budget=drain.budget,
            gate=None,
            stop=threading.Event(),
            on_abandoned=abandoned,
        )

    return in_thread
