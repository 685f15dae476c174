"""The server's shutdown: STOP, the drain, the cut-off, and what the report says.

At STOP the listeners close (the connections still in their queues are
served, not reset) and every connection and the app are told; the server
then waits for the connections to close, with a progress line every
`PROGRESS_INTERVAL` seconds naming the requests still running. At the
cut-off (`cutoff`) what still runs is cut off, and noted in the report of
the bundle the server is a child of.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

from .._core._bundle import Bundle
from .._core._log import library_logger, plural
from .._core._openbundle import current_bundle
from ._serverstate import ServerState

logger = library_logger("trio_graceful.asgi")

# Seconds between two progress lines while the server drains.
PROGRESS_INTERVAL = 1.0


def cutoff(deadline: float, now: float, reserve: float) -> float:
    """Return ``reserve`` before the deadline, or the last tenth of the time left."""
    return deadline - min(reserve, (deadline - now) / 10)


async def drain_server(
    state: ServerState,
    stop_listening: Callable[[], int],
    reserve: float,
    parent: Bundle | None,
) -> None:
    """Drain the server after STOP, within the calling task's deadline.

    ``stop_listening`` closes the listeners and returns how many queued
    connections it took from them (`_listeners.stop_listening`); ``parent``
    is the bundle whose report gets the cut-off's notes. This is a
    checkpoint.
    """
    now = trio.current_time()
    deadline = trio.current_effective_deadline()
    cut = cutoff(deadline, now, reserve) if deadline < math.inf else math.inf
    # Told of the drain before they run: served as every other connection.
    state.drain.begin(cutoff=cut, deadline=deadline)
    queued = stop_listening()
    await state.context.terminated.set()
    logger.info(
        "STOP: draining %s, %s running; cut-off in %s",
        plural(len(state.connections), "connection"),
        plural(sum(len(c.requests) for c in state.connections), "request"),
        "never" if cut == math.inf else f"{cut - now:.1f} s",
    )
    if queued:
        logger.info(
            "STOP: %s taken from the listeners' queues", plural(queued, "connection")
        )
    for connection in list(state.connections):
        connection.stop()
    with trio.move_on_at(cut):
        await _wait_closed(state, cut)
    if state.connections:
        running = state.running_requests()
        logger.warning(
            "cut-off: %s open, %s running%s",
            plural(len(state.connections), "connection"),
            plural(len(running), "request"),
            (", ending them: " + ", ".join(running)) if running else "",
        )
        async with trio.open_nursery() as nursery:
            for connection in list(state.connections):
                nursery.start_soon(connection.cut)
        _tell_bundle(state, parent)
        await _wait_closed(state, deadline)


def parent_bundle() -> Bundle | None:
    """The bundle the calling task is a child of, if it is one."""
    try:
        bundle = current_bundle()
    except RuntimeError:
        return None  # a server in no bundle: the log says it all
    return bundle if trio.lowlevel.current_task() in bundle else None


def _tell_bundle(state: ServerState, bundle: Bundle | None) -> None:
    """Put what the cut-off did in the report of the server's bundle."""
    if bundle is None:
        return
    for request in state.cut_off:
        bundle.note(f"cut off: {request}")
    for thread in state.drain.threads_abandoned:
        bundle.note_abandoned(f"thread {thread!r}")


async def _wait_closed(state: ServerState, until: float) -> None:
    while state.connections:
        with trio.move_on_after(PROGRESS_INTERVAL):
            await state.wait_all_closed()
        if state.connections:
            running = state.running_requests()
            left = until - trio.current_time()
            logger.info(
                "draining: %s open, %s running%s%s",
                plural(len(state.connections), "connection"),
                plural(len(running), "request"),
                (": " + ", ".join(running)) if running else "",
                f"; {left:.1f} s to go" if left < math.inf else "",
            )
