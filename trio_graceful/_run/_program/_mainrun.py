"""Running ``main``: its startup, its readiness, and what its ending asks of the run.

``main`` runs in the root bundle. If it takes ``task_status``, it is started
with `Bundle.start` under a cancel scope (the startup, cancelled when the
shutdown begins first) and a timer (``startup_timeout``); otherwise it is
ready at once. How it ends decides the run's next step, which `MainRun`
reports through a `MainEvents` record without knowing what a program is:
returning None begins the shutdown, `SystemExit` chooses the exit status, an
exception or a wrong return value fails the run.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, final

import attrs
import trio

from ..._core._lowlevel import ForwardingTaskStatus

if TYPE_CHECKING:
    from ..._core._bundle import Bundle


@attrs.frozen(kw_only=True)
class MainEvents:
    """What a `MainRun` tells its run, and the one thing it asks of it."""

    ready: Callable[[], object]
    """``main`` is ready: it called ``task_status.started()``, or takes none."""

    returned: Callable[[], object]
    """``main`` returned None: the shutdown begins."""

    exited: Callable[[SystemExit], object]
    """``main`` raised `SystemExit`."""

    failed: Callable[[str, BaseException | None, bool], object]
    """``main`` failed: the message, the exception if any, and whether the
    failure is one of the startup."""

    shutting_down: Callable[[], bool]
    """Whether the run's shutdown has begun."""


@final
class MainRun:
    """The ``main`` of one run (see the module docstring).

    Args:
        main: The async function.
        args: Its positional arguments.
        takes_task_status: Whether ``main`` takes ``task_status``.
        startup_timeout: Seconds ``main`` may take to become ready.
        events: Where its startup and its ending are reported.
    """

    def __init__(
        self,
        main: Callable[..., Awaitable[object]],
        args: tuple[object, ...],
        *,
        takes_task_status: bool,
        startup_timeout: float,
        events: MainEvents,
    ) -> None:
        self._main = main
        self._args = args
        self._takes_task_status = takes_task_status
        self._startup_timeout = startup_timeout
        self._events = events
        self._startup_scope: trio.CancelScope | None = None
        self._timer_scope = trio.CancelScope()
        # Set at once for a main that takes no task_status.
        self._ready = False

    @property
    def ready(self) -> bool:
        """Whether ``main`` has become ready (and stays so once it has)."""
        return self._ready

    async def start(self, root: Bundle, control: trio.Nursery) -> None:
        """Start ``main`` in ``root``; return once it is ready or its startup ended.

        The startup timer runs in ``control``. This is a checkpoint.
        """
        name = getattr(self._main, "__qualname__", "main")
        if not self._takes_task_status:
            root.start_soon(self._run, name=name)
            self._became_ready()
            return
        with trio.CancelScope() as self._startup_scope:
            if self._startup_timeout != math.inf:
                control.start_soon(
                    self._startup_timer,
                    trio.current_time() + self._startup_timeout,
                    name="<startup timeout>",
                )
            try:
                await root.start(self._run, name=name)
            except Exception as exc:
                # Failures of main's own making were recorded by _run.
                if not self._events.shutting_down():
                    self._events.failed("startup failed", exc, True)
        self._startup_scope = None

    def cancel_startup(self) -> None:
        """Cancel ``main``'s startup if it is still going. Not a checkpoint."""
        if self._startup_scope is not None and not self._ready:
            self._startup_scope.cancel("the shutdown began during startup")

    async def _startup_timer(self, deadline: float) -> None:
        # A timer rather than a deadline on the startup scope, so that the
        # shutdown has begun when main sees the cancellation, as for a signal.
        with self._timer_scope:
            await trio.sleep_until(deadline)
        if not self._ready and not self._events.shutting_down():
            self._events.failed(
                "startup failed: main was not ready within "
                f"{self._startup_timeout:g} s",
                None,
                True,
            )

    async def _run(
        self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
    ) -> None:
        events = self._events
        status = ForwardingTaskStatus(task_status, self._became_ready)
        takes_task_status = self._takes_task_status
        try:
            if takes_task_status:
                result = await self._main(*self._args, task_status=status)
            else:
                result = await self._main(*self._args)
        except SystemExit as exc:
            events.exited(exc)
            return
        except Exception as exc:
            if takes_task_status and not status.started_called:
                raise  # root.start() raises it: the startup failed
            events.failed("main raised", exc, False)
            return
        if takes_task_status and not status.started_called:
            events.failed(
                "startup failed: main returned without calling task_status.started()",
                None,
                True,
            )
        elif result is not None:
            events.failed(
                f"main returned {result!r}; it must return None (raise "
                f"SystemExit(status) to choose the exit status)",
                None,
                False,
            )
        else:
            events.returned()

    def _became_ready(self) -> None:
        self._ready = True
        self._timer_scope.cancel()
        self._events.ready()
