"""One run of a program: its stages, signals and shutdown, from start to exit status.

`Program` is what `trio_graceful.run` runs; `trio_graceful.Runner` is its
public face. The tree of a run::

    root task
    ├── "<services>"
    │   └── bundle "services"     the services, started in order by main
    │       └── service, service ...
    └── bundle "root"             Runner.root
        └── main, and the tasks main starts there

A shutdown, whatever starts it (a signal, `Runner.request_shutdown`, ``main``
returning or failing), runs in this order under one deadline, ``grace``
seconds after it began (the stages are the table in ``_stages``):

1. ``Runner.root.shutdown(grace)``: STOP to the root bundle's inboxes, then
   wait for ``main`` and its tasks, hard-cancelled at the deadline;
2. the services in reverse start order, each getting STOP once the ones
   after it have ended, hard-cancelled at the same deadline.

The deadline is enforced by the bundles alone; the program only notices that
it passed (to log it, pause the collector and start the unwind budget).
Signals escalate as the one table in ``_escalation`` says, counted once for
this thread and the watchdog thread (``_watchdog``), which exits the process
when a shutdown cannot finish. The exit status is a pure function of how the
run ended (``_exitcodes.exit_status``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Awaitable, Callable
from typing import Final, Literal, final

import trio

from .._core._bundle import Bundle
from .._core._cancellation import log_as_news
from .._core._openbundle import open_bundle
from .._core._util import (
    as_group,
    first_leaf,
    in_trio_run,
    signal_name,
)
from ._escalation import Escalation, Observer, Step
from ._exitcodes import Ending, exit_status
from ._gcdeferral import GcHold
from ._lifecycle import Event, Lifecycle
from ._mainrun import MainRun
from ._probes import Probes
from ._runoptions import RunOptions
from ._services import ServiceStack
from ._signals import SignalRelay
from ._stages import Move, Stage, Stages
from ._watchdog import Watchdog

logger = logging.getLogger("trio_graceful.runner")

SHOW_INTERNALS_VARIABLE: Final = "TRIO_GRACEFUL_SHOW_INTERNALS"
"""Set to a non-empty value other than ``0`` to show the frames of trio and
trio_graceful in the emergency report."""


PID_1_WARNING: Final = (
    "running as PID 1: orphaned processes will not be reaped and signals "
    "without a handler are ignored; run the program under an init "
    "(docker run --init, or tini in the image's ENTRYPOINT)"
)
"""Logged at startup by a program that is the first process of its PID
namespace: a container without an init."""


def _format_grace(grace: float) -> str:
    return "no time limit" if grace == math.inf else f"grace {grace:g} s"


def _interrupt_of(exc: BaseException) -> BaseException | None:
    """The first KeyboardInterrupt of a group holding nothing else but Cancelled."""
    group = as_group(exc)
    if group is None:
        return None
    interrupts, rest = group.split(KeyboardInterrupt)
    if interrupts is None or (rest is not None and rest.split(trio.Cancelled)[1]):
        return None
    return first_leaf(interrupts)


@final
class Program:
    """One `trio_graceful.run` call (see the module docstring)."""

    def __init__(
        self,
        main: Callable[..., Awaitable[object]],
        args: tuple[object, ...],
        options: RunOptions,
        *,
        budget_warning: str | None = None,
    ) -> None:
        self.main = MainRun(self, main, args)
        self.budget_warning = budget_warning
        self.options = options
        self.lifecycle: Lifecycle = Lifecycle._create(self.options.name)  # pyright: ignore[reportPrivateUsage]
        # Called first in the run's root task (makes current_runner() work).
        self.on_start: Callable[[], object] = lambda: None
        self.stages = Stages()
        self.escalation = Escalation(options.second_signal)
        self.relay = SignalRelay(options.signals)
        self.watchdog = Watchdog(
            grace=options.grace,
            drain_delay=options.drain_delay,
            unwind_budget=options.unwind_budget,
            signals=self.relay.handled,
            exit_codes=options.exit_codes,
            escalation=self.escalation,
        )
        self.gc = GcHold()
        self.probes = Probes(self)
        self.token: trio.lowlevel.TrioToken | None = None
        self.control: trio.Nursery | None = None
        self.root: Bundle | None = None
        self.services: ServiceStack | None = None
        self.services_bundle: Bundle | None = None
        self.delay_scope = trio.CancelScope()
        self.delay_ends = math.inf
        self.health_address: tuple[str, int] | None = None
        self.deadline = math.inf
        self.failure: Literal["error", "startup"] | None = None
        self.system_exit: tuple[object] | None = None
        self.status: int | None = None

    # -- entry point ---------------------------------------------------------------

    def execute(self) -> int:
        if os.getpid() == 1:
            # Reaping orphans here (waitpid(-1)) would take the exit
            # statuses that Trio waits for: that is an init's job.
            logger.warning("%s", PID_1_WARNING)
        self.watchdog.show_internals = os.environ.get(
            SHOW_INTERNALS_VARIABLE, ""
        ) not in ("", "0")
        self.watchdog.start()
        try:
            with self.relay.installed():
                try:
                    trio.run(
                        self._root_task,
                        clock=self.options.clock,
                        instruments=[self.watchdog.instrument],
                    )
                except BaseException as exc:
                    # As trio.run would raise it, not wrapped in our nurseries.
                    interrupt = _interrupt_of(exc)
                    if interrupt is None:
                        raise
                    raise interrupt from None
        finally:
            self.watchdog.stop()
            self.gc.release()
        assert self.status is not None
        return self.status

    async def _root_task(self) -> None:
        self.on_start()
        if self.budget_warning is not None:
            logger.warning("%s", self.budget_warning)
        # The bundles main opens ("root/<main>/connections") are the
        # program's own top level: their cancellations are news at INFO.
        log_as_news(2)
        self.token = trio.lowlevel.current_trio_token()
        self.watchdog.root_task = trio.lowlevel.current_task()
        with contextlib.ExitStack() as stack:
            async with trio.open_nursery() as control:
                self.control = control
                self.probes.start(control)
                root_closed = trio.Event()
                await control.start(self._run_services, root_closed, name="<services>")
                self.transition(Event.START, "")
                if self.relay.handled:
                    self._connect_signals()
                    stack.callback(self.relay.disconnect)
                    stack.enter_context(self.watchdog.counting_signals())
                await self.probes.start_health_endpoint()
                await self._run_root_bundle()
                self.stages.move(Move.ROOT_CLOSED)
                root_closed.set()
        self.status = self._exit_status()
        self.transition(Event.TERMINATE, f"exit status {self.status}")

    async def _run_services(
        self, root_closed: trio.Event, *, task_status: trio.TaskStatus[None]
    ) -> None:
        # In a task of its own, so that neither top-level bundle is inside
        # the other: both are named by their own names in the log.
        async with open_bundle(name="services") as services_bundle:
            self.services_bundle = services_bundle
            self.services = ServiceStack(services_bundle, self._service_failed)
            task_status.started()
            await root_closed.wait()
            await self.services.stop(self.deadline)
        self.stages.move(Move.SERVICES_CLOSED)
        assert self.control is not None
        self.control.cancel_scope.cancel()  # the end-of-grace observer

    # -- main and the root bundle ----------------------------------------------------

    async def _run_root_bundle(self) -> None:
        try:
            async with open_bundle(name="root") as root:
                self.root = root
                # A program asked to stop before it began does not begin.
                if not self.stages.shutting_down:
                    await self.main.start(root)
                await self.stages.wait_shutting_down()
                await root.shutdown(max(0.0, self.deadline - trio.current_time()))
        except BaseException as exc:
            self._root_raised(exc)

    def _root_raised(self, exc: BaseException) -> None:
        """A task on the root bundle raised: fail, or exit as SystemExit asks."""
        exits: BaseException | None
        rest: BaseException | None
        group = as_group(exc)
        if group is not None:
            exits, rest = group.split(SystemExit)
        else:
            exits, rest = (exc, None) if isinstance(exc, SystemExit) else (None, exc)
        if rest is not None and not isinstance(rest, Exception):
            raise exc  # KeyboardInterrupt and the like end the run as in Trio
        if exits is not None:
            leaf = first_leaf(exits)
            assert isinstance(leaf, SystemExit)
            self.exit_requested("a task of the root bundle", leaf)
        if rest is not None:
            failure = exc if exits is None else rest
            self.fail("a task of the root bundle raised", failure)

    def _service_failed(self, name: str, exc: BaseException) -> None:
        if isinstance(exc, SystemExit):
            self.exit_requested(f"service {name!r}", exc)
        else:
            self.fail(f"service {name!r} raised", exc, startup=not self.main.ready)

    def exit_requested(self, who: str, exc: SystemExit) -> None:
        """Take the exit status from the first SystemExit; begin the shutdown."""
        if self.system_exit is None:
            self.system_exit = (exc.code,)
        self.begin_shutdown(f"{who} raised SystemExit({exc.code!r})")

    # -- shutdown --------------------------------------------------------------------

    def begin_shutdown(
        self, reason: str, *, signum: int | None = None, delay: bool = False
    ) -> bool:
        """Start the shutdown; False if it had already begun.

        With ``delay`` (a signal, `Runner.request_shutdown`), a program that
        takes work is first withdrawn from rotation for the drain delay.
        Without (main ended, a failure), a withdrawn program shuts down now.
        """
        if self.stages.shutting_down or (delay and self.stages.withdrawn):
            return False
        if delay and self.options.drain_delay > 0 and self.lifecycle.ready:
            self._withdraw(reason, signum)
        else:
            self._shut_down(reason, signum)
        return True

    def _withdraw(self, reason: str, signum: int | None) -> None:
        delay = self.options.drain_delay
        self.stages.move(Move.WITHDRAW)
        self.delay_ends = trio.current_time() + delay
        self.transition(Event.WITHDRAW, reason)
        self.watchdog.withdrawal_began()
        logger.log(
            logging.WARNING if signum is not None else logging.INFO,
            "%s: not ready; serving %g s more (drain delay), then shutting down (%s)",
            signal_name(signum) if signum is not None else reason,
            delay,
            _format_grace(self.options.grace),
        )
        assert self.control is not None
        self.control.start_soon(self._end_drain_delay, reason, name="<drain delay>")

    async def _end_drain_delay(self, reason: str) -> None:
        with self.delay_scope:
            await trio.sleep_until(self.delay_ends)
        if self.stages.withdrawn:
            self._shut_down(f"{reason}, after the drain delay", None)

    def _shut_down(self, reason: str, signum: int | None) -> None:
        self.delay_scope.cancel()
        self.deadline = trio.current_time() + self.options.grace
        self.stages.move(Move.SHUT_DOWN)
        self.transition(Event.SHUT_DOWN, reason)
        assert self.services is not None
        self.services.close(
            f"program {self.options.name!r} is shutting down; "
            "no new services can be started"
        )
        self.main.cancel_startup()
        self.watchdog.shutdown_began()
        # What the program built before its shutdown is long-lived; full
        # collections during the drain would walk all of it again and again
        # (1,000 WebSocket connections of the example server were all closed
        # in 0.2 s instead of 0.3 without them).
        self.gc.hold_full_collections()
        if signum is not None:
            logger.warning(
                "%s: shutting down (%s)",
                signal_name(signum),
                _format_grace(self.options.grace),
            )
        else:
            logger.info(
                "shutting down (%s): %s", _format_grace(self.options.grace), reason
            )
        if self.deadline != math.inf:
            assert self.control is not None
            self.control.start_soon(self._notice_end_of_grace, name="<end of grace>")

    async def _notice_end_of_grace(self) -> None:
        # The bundles' own deadlines hard-cancel; this only notices.
        await trio.sleep_until(self.deadline)
        self.force(f"the {_format_grace(self.options.grace)} ran out", cancel=False)

    def force(self, reason: str, *, cancel: bool = True) -> None:
        """Hard-cancel what is draining now; the unwind budget starts."""
        if self.stages.forced or self.stages.stage is Stage.ENDED:
            return
        if self.stages.withdrawn:  # a second signal during the drain delay
            self._shut_down(f"{reason}, during the drain delay", None)
        stage = self.stages.move(Move.FORCE)
        self.deadline = min(self.deadline, trio.current_time())
        # The program is ending: collecting garbage while thousands of tasks
        # unwind only delays that (1,000 WebSocket connections unwound in
        # 0.35 s instead of 0.8 s).
        self.gc.hold_pause()
        logger.warning("forcing: %s", reason)
        self.watchdog.hard_cancel_began()
        # The services outlive main even now (main's unwinding may use them):
        # their deadline is set, now passed, once the root bundle has closed.
        bundle = self.services_bundle if stage is Stage.FORCED_SERVICES else self.root
        if cancel and bundle is not None and not bundle.closed:
            assert self.control is not None
            self.control.start_soon(
                bundle.cancel, 0, name=f"<hard cancel of {bundle.name!r}>"
            )

    def fail(
        self, message: str, exc: BaseException | None, *, startup: bool = False
    ) -> None:
        """Log a failure once, set the exit status, begin the shutdown."""
        logger.error("%s", message, exc_info=exc)
        if self.failure is None:
            self.failure = "startup" if startup else "error"
        self.begin_shutdown(message)

    # -- signals ---------------------------------------------------------------------

    def _connect_signals(self) -> None:
        token = self.token
        assert token is not None

        def deliver(signum: int) -> None:  # in the signal handler
            token.run_sync_soon(self._on_signal, signum)

        self.watchdog.wake_trio = lambda: token.run_sync_soon(self._catch_up)
        # Signals that came before now: neither observer has counted them.
        for signum in self.relay.connect(deliver):
            self.escalation.record_early(signum)
            self._do_steps(self.escalation.catch_up(Observer.TRIO), signum)

    def _on_signal(self, signum: int) -> None:
        self._do_steps(self.escalation.record(Observer.TRIO, signum), signum)

    def _catch_up(self) -> None:
        # The watchdog saw signals that this thread has not (merged by CPython).
        signum = self.escalation.last_signal
        if signum is not None:
            self._do_steps(self.escalation.catch_up(Observer.TRIO), signum)

    def _do_steps(self, steps: tuple[Step, ...], signum: int) -> None:
        name = signal_name(signum)
        for step in steps:
            if step is Step.SHUT_DOWN:
                if not self.begin_shutdown(name, signum=signum, delay=True):
                    logger.warning(
                        "%s: already shutting down; send it again to force", name
                    )
            elif step is Step.FORCE:
                self.force(f"{name} again")
            else:
                self.watchdog.do_step(step, signum)

    # -- helpers -----------------------------------------------------------------------

    def transition(self, event: Event, reason: str) -> None:
        source = self.lifecycle.state
        self.lifecycle._transition(event, reason)  # pyright: ignore[reportPrivateUsage]
        self.probes.transitioned(event, source)

    def check_thread(self, method: str) -> None:
        if not in_trio_run(self.token):
            raise RuntimeError(
                f"Runner.{method}() must be called from the Trio thread of "
                f"program {self.options.name!r}; from another thread use "
                f"trio.from_thread.run_sync(runner.{method})"
            )

    def _exit_status(self) -> int:
        code = self.system_exit[0] if self.system_exit is not None else None
        if self.failure is None and not (code is None or isinstance(code, int)):
            logger.error("%s", code)  # as Python prints SystemExit("message")
        forced_by: Literal["grace", "signal"] | None = None
        if self.stages.forced:
            forced_by = "signal" if self.escalation.level >= 2 else "grace"
        ending = Ending(
            failure=self.failure,
            system_exit=self.system_exit,
            first_signal=self.escalation.first_signal,
            forced_by=forced_by,
        )
        return exit_status(self.options.exit_codes, ending)
