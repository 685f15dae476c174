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
import logging
import math
from typing import TYPE_CHECKING, Final, final

import trio

from .._deploy._health import HealthAnswer
from .._deploy._healthserve import open_health_listeners, serve_health
from .._deploy._sdnotify import notifier_from_environment
from ._lifecycle import Event, LifecycleState
from ._programstatus import ProgramStatus, current_status

if TYPE_CHECKING:
    from ._program import Program

logger = logging.getLogger("trio_graceful.runner")

PROGRESS_INTERVAL: Final = 1.0
"""Seconds between two ``STATUS=`` lines of a shutdown under systemd."""

_LEAVING: Final = frozenset({LifecycleState.WITHDRAWN, LifecycleState.SHUTTING_DOWN})


@final
class Probes:
    """The health endpoint and the service manager's notifications of one run."""

    def __init__(self, program: Program) -> None:
        self._program = program
        # Read (and removed from the environment) once, before any child
        # process can inherit it.
        self.notifier = notifier_from_environment()

    def start(self, control: trio.Nursery) -> None:
        """Start the keep-alives, if the manager wants them. Not a checkpoint."""
        if self.notifier.watchdog_interval is not None:
            control.start_soon(self._keep_alive, name="<systemd watchdog>")

    async def start_health_endpoint(self) -> None:
        """Start the health endpoint as a service, if asked to. This is a checkpoint.

        A port that cannot be used fails the startup, with the port named.
        """
        program = self._program
        port = program.options.health_port
        if port is None:
            return
        try:
            listeners = await open_health_listeners(program.options.health_host, port)
        except OSError as exc:
            program.fail(f"startup failed: {exc}", None, startup=True)
            return
        assert program.services is not None
        serve = functools.partial(
            serve_health, max_connections=program.options.health_max_connections
        )
        await program.services.start(
            serve, (listeners, self._answer), "health endpoint"
        )
        host, bound = listeners[0].socket.getsockname()[:2]
        program.health_address = (str(host), int(bound))
        logger.info("health endpoint on port %d", bound)

    def transitioned(self, event: Event, source: LifecycleState) -> None:
        """Tell the service manager of a lifecycle transition. Not a checkpoint."""
        notifier = self.notifier
        if not notifier.enabled:
            return
        status = current_status(self._program)
        if event is Event.BECOME_READY:
            notifier.ready(status=status.describe())
        elif status.state in _LEAVING and source not in _LEAVING:
            notifier.stopping(status=status.describe())
            assert self._program.control is not None
            self._program.control.start_soon(
                self._report_progress, name="<systemd progress>"
            )
        elif status.state is not LifecycleState.TERMINATED:
            notifier.status(status.describe())

    def _answer(self) -> HealthAnswer:
        status = current_status(self._program)
        return HealthAnswer(
            live=status.live,
            ready=status.ready,
            status=status.as_dict(),
            # Degraded is ready, but says why, as not ready does.
            reason="" if status.state is LifecycleState.READY else status.describe(),
        )

    def _time_left(self, status: ProgramStatus) -> float:
        """The latest the shutdown can still take from now (the watchdog's bound)."""
        options = self._program.options
        if status.forced:
            return options.unwind_budget
        if status.drain_delay_left is not None:
            return status.drain_delay_left + options.grace + options.unwind_budget
        if status.grace_left is not None:
            return status.grace_left + options.unwind_budget
        return math.inf  # no grace limit: the manager's own timeout applies

    async def _report_progress(self) -> None:
        while True:
            status = current_status(self._program)
            left = self._time_left(status)
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
