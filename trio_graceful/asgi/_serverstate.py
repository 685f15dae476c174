"""What every connection of one ASGI server shares, and its statistics.

`ServerState` holds the app and Hypercorn's configuration, the worker context
Hypercorn's protocols consult (its ``terminated`` event is set at STOP, so
that HTTP/2 refuses new streams), the `Drain` the app sees, and the live
connections, which it counts. `AsgiServerStatistics` is its snapshot.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Any, Protocol, final

import attrs
import trio
from hypercorn.config import Config
from hypercorn.trio.worker_context import EventWrapper, TrioSingleTask
from hypercorn.typing import AppWrapper, Event, SingleTask

from .._children._threads import ThreadBudget
from .._core._log import library_logger
from ._drain import Drain

logger = library_logger("trio_graceful.asgi")


@attrs.frozen
class AsgiServerStatistics:
    """A snapshot of a server, returned by `AsgiServer.statistics`."""

    connections_open: int
    """Connections accepted that have not closed yet."""

    connections_total: int
    """Connections accepted since the server started."""

    requests_running: int
    """Requests (WebSocket sessions included) whose app has not returned."""

    requests_total: int
    """Requests received since the server started."""

    requests_cut_off: int
    """Requests still running at the cut-off, which ended their responses
    (or were answered 503 without running, if pipelined behind one)."""

    threads_abandoned: int
    """Threads of `sync_to_async` calls whose request was cut off while they
    ran (they run on, holding their tokens, until they return)."""

    draining: bool
    """True once the server got STOP."""


@final
class _Context:
    """Hypercorn's worker context: its protocols read ``terminated``."""

    event_class: type[Event] = EventWrapper
    single_task_class: type[SingleTask] = TrioSingleTask

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self.terminate: Event = EventWrapper()
        self.terminated: Event = EventWrapper()

    async def mark_request(self) -> None:
        # Hypercorn's max_requests (restart a worker after so many) has no
        # meaning for a service whose supervisor restarts the process.
        self._state.requests_total += 1

    @staticmethod
    async def sleep(wait: float) -> None:
        await trio.sleep(wait)

    @staticmethod
    def time() -> float:
        return trio.current_time()


class OpenConnection(Protocol):
    """What the server asks of a live connection (``_connection.Connection``)."""

    @property
    def requests(self) -> AbstractSet[trio.lowlevel.Task]:
        """The tasks of the requests running on it."""
        ...

    def stop(self) -> None:
        """STOP: close once idle. Not a checkpoint."""
        ...

    async def cut(self) -> None:
        """Cancel the running requests, which end their responses."""
        ...


@final
class ServerState:
    """The state one server's connections share (see the module docstring)."""

    def __init__(self, app: AppWrapper, config: Config, budget: ThreadBudget) -> None:
        self.app = app
        self.config = config
        self.context = _Context(self)
        self.drain = Drain(budget)
        self.lifespan_state: dict[str, Any] = {}
        self.connections: set[OpenConnection] = set()
        self.connections_total = 0
        self.requests_total = 0
        # "GET /path: what its end was" for each request cut off.
        self.cut_off: list[str] = []
        # Set when the last connection closes, for whoever waits for that.
        self._all_closed: trio.Event | None = None

    def connection_started(self, connection: OpenConnection) -> None:
        """Count a connection that was accepted."""
        self.connections.add(connection)
        self.connections_total += 1

    def connection_ended(self, connection: OpenConnection) -> None:
        """Forget a connection that has closed."""
        self.connections.discard(connection)
        if not self.connections and self._all_closed is not None:
            self._all_closed.set()

    async def wait_all_closed(self) -> None:
        """Wait until no connection is open. This is a checkpoint."""
        if not self.connections:
            await trio.lowlevel.checkpoint()
            return
        self._all_closed = trio.Event()
        await self._all_closed.wait()

    def request_cut(self, name: str, what: str) -> None:
        """Record a request that was cut off; ``what`` says how it ended."""
        self.cut_off.append(f"{name}: {what}")
        logger.debug("request cut off: %s: %s", name, what)

    def running_requests(self) -> list[str]:
        """The names of the requests running now (``GET /path``), sorted."""
        return sorted(
            task.name for connection in self.connections for task in connection.requests
        )

    def statistics(self) -> AsgiServerStatistics:
        """Return an `AsgiServerStatistics` snapshot. Not a checkpoint."""
        return AsgiServerStatistics(
            connections_open=len(self.connections),
            connections_total=self.connections_total,
            requests_running=sum(len(c.requests) for c in self.connections),
            requests_total=self.requests_total,
            requests_cut_off=len(self.cut_off),
            threads_abandoned=len(self.drain.threads_abandoned),
            draining=self.drain.stopped.is_set(),
        )
