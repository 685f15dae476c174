"""Running ``main``: its startup, its readiness, and what its ending asks of the run.

``main`` runs in the root bundle. If it takes ``task_status``, it is started
with `Bundle.start` under a cancel scope (the startup, cancelled when the
shutdown begins first) and a timer (``startup_timeout``); otherwise it is
ready at once. How it ends decides the run's next step, through the program:
returning None begins the shutdown, `SystemExit` chooses the exit status, an
exception or a wrong return value fails the run.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, final

import trio

from .._core._util import ForwardingTaskStatus
from ._lifecycle import Event, LifecycleState

if TYPE_CHECKING:
    from .._core._bundle import Bundle
    from ._program import Program


@final
class MainRun:
    """The ``main`` of one run (see the module docstring)."""

    def __init__(
        self,
        program: Program,
        main: Callable[..., Awaitable[object]],
        args: tuple[object, ...],
    ) -> None:
        self._program = program
        self._main = main
        self._args = args
        self._startup_scope: trio.CancelScope | None = None
        self._timer_scope = trio.CancelScope()
        # Set at once for a main that takes no task_status.
        self.ready = False
        """Whether ``main`` is ready: it called ``task_status.started()``."""

    async def start(self, root: Bundle) -> None:
        """Start ``main`` in ``root``; return once it is ready or its startup ended.

        This is a checkpoint.
        """
        program = self._program
        options = program.options
        name = getattr(self._main, "__qualname__", "main")
        if not options.takes_task_status:
            root.start_soon(self._run, name=name)
            self._became_ready()
            return
        assert program.control is not None
        with trio.CancelScope() as self._startup_scope:
            if options.startup_timeout != math.inf:
                program.control.start_soon(
                    self._startup_timer,
                    trio.current_time() + options.startup_timeout,
                    name="<startup timeout>",
                )
            try:
                await root.start(self._run, name=name)
            except Exception as exc:
                # Failures of main's own making were recorded by _run.
                if not program.stages.shutting_down:
                    program.fail("startup failed", exc, startup=True)
        self._startup_scope = None

    def cancel_startup(self) -> None:
        """Cancel ``main``'s startup if it is still going. Not a checkpoint."""
        if self._startup_scope is not None and not self.ready:
            self._startup_scope.cancel("the shutdown began during startup")

    async def _startup_timer(self, deadline: float) -> None:
        # A timer rather than a deadline on the startup scope, so that the
        # shutdown has begun when main sees the cancellation, as for a signal.
        with self._timer_scope:
            await trio.sleep_until(deadline)
        program = self._program
        if not self.ready and not program.stages.shutting_down:
            program.fail(
                "startup failed: main was not ready within "
                f"{program.options.startup_timeout:g} s",
                None,
                startup=True,
            )

    async def _run(
        self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
    ) -> None:
        program = self._program
        status = ForwardingTaskStatus(task_status, self._became_ready)
        takes_task_status = program.options.takes_task_status
        try:
            if takes_task_status:
                result = await self._main(*self._args, task_status=status)
            else:
                result = await self._main(*self._args)
        except SystemExit as exc:
            program.exit_requested("main", exc)
            return
        except Exception as exc:
            if takes_task_status and not status.started_called:
                raise  # root.start() raises it: the startup failed
            program.fail("main raised", exc)
            return
        if takes_task_status and not status.started_called:
            program.fail(
                "startup failed: main returned without calling task_status.started()",
                None,
                startup=True,
            )
        elif result is not None:
            program.fail(
                f"main returned {result!r}; it must return None (raise "
                f"SystemExit(status) to choose the exit status)",
                None,
            )
        else:
            program.begin_shutdown("main returned")

    def _became_ready(self) -> None:
        self.ready = True
        self._timer_scope.cancel()
        if self._program.lifecycle.state is LifecycleState.STARTING:
            self._program.transition(Event.BECOME_READY, "main is ready")
