"""What a program run by `trio_graceful.run` tells those who watch it from outside.

Two audiences, two mechanisms; this module is the policy over both:

* **Probes** (a load balancer, the kubelet) ask the HTTP health endpoint
  (``_health``), when ``run`` is given a ``health_port``: ``/livez``,
  ``/readyz`` and ``/statusz``, each answered from `ProgramStatus` at the
  moment of the request. The endpoint is the run's first service, so it
  starts before ``main`` and stops last: the program is live until it exits.
* **The service manager** (systemd) is told, when ``$NOTIFY_SOCKET`` is set
  (``_sdnotify``), ``READY=1`` once ``main`` is ready, ``STOPPING=1`` the
  moment the shutdown is asked for (at the start of the drain delay),
  ``STATUS=`` lines when the state changes and every `PROGRESS_INTERVAL`
  seconds while the program leaves, each with ``EXTEND_TIMEOUT_USEC`` up to
  the latest moment the shutdown can end (the watchdog's), and ``WATCHDOG=1``
  keep-alives for the whole run when ``$WATCHDOG_USEC`` asks for them. The
  keep-alives come from a Trio task: a stuck Trio thread stops them, which
  is what the manager's watchdog is for.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Final, final

import trio

from ..._core._log import library_logger
from ..._deploy._health import HealthAnswer
from ..._deploy._healthserve import open_health_listeners, serve_health
from ..._deploy._sdnotify import notifier_from_environment
from .._shutdown._stoptime import Part, StopTimes
from ._lifecycle import LifecycleEvent, LifecycleState
from ._programstatus import ProgramStatus
from ._services import ServiceStack

logger = library_logger("trio_graceful.runner")

PROGRESS_INTERVAL: Final = 1.0
"""Seconds between two ``STATUS=`` lines of a shutdown under systemd."""

_LEAVING: Final = frozenset({LifecycleState.WITHDRAWN, LifecycleState.SHUTTING_DOWN})


def time_left(times: StopTimes, status: ProgramStatus) -> float:
    """The latest the shutdown in ``status`` can still take (the watchdog's bound)."""
    if status.forced:
        return times.time_left(Part.UNWIND)
    if status.drain_delay_left is not None:
        return times.time_left(Part.DRAIN_DELAY, status.drain_delay_left)
    if status.grace_left is not None:
        return times.time_left(Part.GRACE, status.grace_left)
    return math.inf  # no grace limit: the manager's own timeout applies


@final
class Probes:
    """The health endpoint and the service manager's notifications of one run.

    Args:
        status: Returns the program's status now.
        fail: Fails the startup with a message (a port that cannot be used).
        times: The run's stop times, for the time the manager should wait.
        health_port: The health endpoint's port; None for no endpoint.
        health_host: The address it listens on; None for every interface.
        health_max_connections: The connections it holds at once.
    """

    def __init__(
        self,
        *,
        status: Callable[[], ProgramStatus],
        fail: Callable[[str], object],
        times: StopTimes,
        health_port: int | None,
        health_host: str | None,
        health_max_connections: int,
    ) -> None:
        self._status = status
        self._fail = fail
        self._times = times
        self._health = (health_port, health_host, health_max_connections)
        self._control: trio.Nursery | None = None
        self._health_address: tuple[str, int] | None = None
        # Read (and removed from the environment) once, before any child
        # process can inherit it.
        self.notifier = notifier_from_environment()

    @property
    def health_address(self) -> tuple[str, int] | None:
        """Where the health endpoint listens, once it does; else None."""
        return self._health_address

    def start(self, control: trio.Nursery) -> None:
        """Start the keep-alives, if the manager wants them. Not a checkpoint.

        The keep-alives and, later, the shutdown's progress run in ``control``.
        """
        self._control = control
        if self.notifier.watchdog_interval is not None:
            control.start_soon(self._keep_alive, name="<systemd watchdog>")

    async def start_health_endpoint(self, services: ServiceStack) -> None:
        """Start the health endpoint among ``services``, if it has a port.

        A port that cannot be used fails the startup, with the port named.
        This is a checkpoint.
        """
        port, host, max_connections = self._health
        if port is None:
            return
        try:
            listeners = await open_health_listeners(host, port)
        except OSError as exc:
            self._fail(f"startup failed: {exc}")
            return
        serve = functools.partial(serve_health, max_connections=max_connections)
        await services.start(serve, (listeners, self._answer), "health endpoint")
        bound_host, bound = listeners[0].socket.getsockname()[:2]
        self._health_address = (str(bound_host), int(bound))
        logger.info("health endpoint on port %d", bound)

    def transitioned(self, event: LifecycleEvent, source: LifecycleState) -> None:
        """Tell the service manager of a lifecycle transition. Not a checkpoint."""
        notifier = self.notifier
        if not notifier.enabled:
            return
        status = self._status()
        if event is LifecycleEvent.BECOME_READY:
            notifier.ready(status=status.describe())
        elif status.state in _LEAVING and source not in _LEAVING:
            notifier.stopping(status=status.describe())
            assert self._control is not None
            self._control.start_soon(self._report_progress, name="<systemd progress>")
        elif status.state is not LifecycleState.TERMINATED:
            notifier.status(status.describe())

    def _answer(self) -> HealthAnswer:
        status = self._status()
        return HealthAnswer(
            live=status.live,
            ready=status.ready,
            status=status.as_dict(),
            # Degraded is ready, but says why, as not ready does.
            reason="" if status.state is LifecycleState.READY else status.describe(),
        )

    async def _report_progress(self) -> None:
        while True:
            status = self._status()
            left = time_left(self._times, status)
            if left == math.inf:
                self.notifier.status(status.describe())
            else:
                self.notifier.extend_timeout(left, status=status.describe())
            await trio.sleep(PROGRESS_INTERVAL)

    async def _keep_alive(self) -> None:
        interval = self.notifier.watchdog_interval
        assert interval is not None
        while True:
            self.notifier.watchdog()
            await trio.sleep(interval)
