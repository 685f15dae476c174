"""How a request handler hears STOP: the server's drain, seen from the app.

`serve_asgi` makes one `Drain` per server and puts it in a context variable
that every connection, and so every request task, inherits (Starlette's and
Quart-Trio's tasks inherit the request task's context too, and so do the
threads Trio starts for sync endpoints), and so does the app's lifespan,
whose tasks may wait for STOP too. The functions here read it:
`stop_received` to check, `wait_stop` to wait, `until_stop` as the idle
point of a stream or a WebSocket loop, `stop_deadline` for the time left and
`current_stop_flag` for a thread.
"""

from __future__ import annotations

import contextvars
import math
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import attrs
import trio

from .._children._threads import StopFlag, ThreadBudget
from .._core._stop import STOP, StopType

if TYPE_CHECKING:
    from typing_extensions import TypeVarTuple, Unpack

    PosArgT = TypeVarTuple("PosArgT")

R = TypeVar("R")


@attrs.define(eq=False)
class Drain:
    """One server's drain: when STOP came and when requests are cut off.

    And the thread budget of its sync endpoints, whose abandoned threads it
    counts.
    """

    budget: ThreadBudget
    stopped: trio.Event = attrs.field(factory=trio.Event)
    # Threads read this one; a trio.Event is for the Trio thread only.
    flag: threading.Event = attrs.field(factory=threading.Event)
    # Trio time: the cut-off for requests, and the hard deadline after it.
    cutoff: float = math.inf
    deadline: float = math.inf
    threads_abandoned: list[str] = attrs.field(factory=list[str])
    # The scopes of the until_stop calls under way, cancelled at STOP.
    _waiting: set[trio.CancelScope] = attrs.field(factory=set["trio.CancelScope"])

    def begin(self, *, cutoff: float, deadline: float) -> None:
        """Tell every handler that STOP has come. Not a checkpoint."""
        self.cutoff = cutoff
        self.deadline = deadline
        self.stopped.set()
        self.flag.set()
        for scope in self._waiting:
            scope.cancel("the server got STOP")

    async def until_stop(
        self, async_fn: Callable[..., Awaitable[R]], args: tuple[object, ...]
    ) -> R | StopType:
        if self.stopped.is_set():
            await trio.lowlevel.checkpoint()
            return STOP
        with trio.CancelScope() as scope:
            self._waiting.add(scope)
            try:
                return await async_fn(*args)
            finally:
                self._waiting.discard(scope)
        # Only begin() cancels the scope.
        return STOP


_current: contextvars.ContextVar[Drain] = contextvars.ContextVar(
    "trio_graceful.asgi.drain"
)


def enter_drain(drain: Drain) -> None:
    """Make ``drain`` the one the calling task, and the tasks it starts, see."""
    _current.set(drain)


def current_drain(function: str) -> Drain:
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError(
            f"trio_graceful.asgi.{function}() was called outside a request served "
            f"by trio_graceful.asgi.serve_asgi()"
        ) from None


def stop_received() -> bool:
    """Return True once the server serving this request has got STOP.

    Call it from a request handler, a streaming response's generator, a
    WebSocket handler or a thread they started (sync endpoints included).
    Not a checkpoint.

    Raises:
        RuntimeError: if called outside a request served by `serve_asgi`.
    """
    return current_drain("stop_received").flag.is_set()


async def wait_stop() -> None:
    """Wait until the server serving this request gets STOP.

    Returns at once if it has. This is a checkpoint.

    Raises:
        RuntimeError: if called outside a request served by `serve_asgi`.
    """
    await current_drain("wait_stop").stopped.wait()


async def until_stop(
    async_fn: Callable[[Unpack[PosArgT]], Awaitable[R]], *args: Unpack[PosArgT]
) -> R | StopType:
    """Run ``await async_fn(*args)`` until it returns or the server gets STOP.

    The idle point of a handler that waits for something, like a stream
    waiting for its next event or a WebSocket handler waiting for the next
    message: at STOP the wait is cancelled and `trio_graceful.STOP` is
    returned, so the handler can send a last event, or CLOSE 1001, and end.
    As with `trio_graceful.InboxReceiver.until_stop`, nothing is lost if
    ``async_fn`` is cancel-safe, as Starlette's ``WebSocket.receive`` and an
    ASGI ``receive`` are. If the server already got STOP,
    `trio_graceful.STOP` is returned at once without calling ``async_fn``.
    This is a checkpoint.

    Returns:
        What ``async_fn`` returned, or `trio_graceful.STOP`.

    Raises:
        RuntimeError: if called outside a request served by `serve_asgi`.
    """
    return await current_drain("until_stop").until_stop(async_fn, args)


def stop_deadline() -> float:
    """Return the Trio time at which running requests are cut off.

    `math.inf` until the server gets STOP, and after it if its grace has no
    limit. A stream that wants to end on its own before it is cut off can
    compare ``trio.current_time()`` with it. Not a checkpoint.

    Raises:
        RuntimeError: if called outside a request served by `serve_asgi`.
    """
    return current_drain("stop_deadline").cutoff


def current_stop_flag() -> StopFlag:
    """Return a `trio_graceful.StopFlag` that is set when the server gets STOP.

    For sync endpoints, which run in threads: poll ``flag.is_set()`` at safe
    points, or use ``flag.wait(timeout)`` as a sleep that ends at STOP. Not a
    checkpoint; thread-safe.

    Raises:
        RuntimeError: if called outside a request served by `serve_asgi`.
    """
    event = current_drain("current_stop_flag").flag
    return StopFlag._create(event)  # pyright: ignore[reportPrivateUsage]
