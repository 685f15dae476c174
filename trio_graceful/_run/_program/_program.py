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
seconds after it began (the stages are the table in ``_shutdown._stages``):

1. ``Runner.root.shutdown(grace)``: STOP to the root bundle's inboxes, then
   wait for ``main`` and its tasks, hard-cancelled at the deadline;
2. the services in reverse start order, each getting STOP once the ones
   after it have ended, hard-cancelled at the same deadline.

The sequence itself (the drain delay, the deadline, the force) is
``_shutdown._sequence``'s; the program runs the bundles it drains. Its parts
report to it through callbacks (``_mainrun.MainEvents``,
``_sequence.ShutdownHooks``, the probes' status and fail functions), so none
of them knows the program. Signals escalate as the one table in
``_signals._escalation`` says, counted once for this thread and the watchdog
thread (``_exit._watchdog``), which exits the process when a shutdown cannot
finish. The exit status is a pure function of how the run ended
(``_exit._status.exit_status``), whose facts an `EndingRecorder` keeps.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable
from typing import Final, Literal, final

import trio

from ..._core._bundle import Bundle
from ..._core._cancellation import log_as_news
from ..._core._log import library_logger, one_line
from ..._core._lowlevel import signal_name
from ..._core._openbundle import open_bundle
from .._exit._policy import bound_the_exit, show_internals
from .._exit._status import EndingRecorder, interrupt_of, split_exits
from .._exit._watchdog import Watchdog
from .._options._runoptions import RunSettings
from .._shutdown._gcdeferral import GcHold
from .._shutdown._sequence import Shutdown, ShutdownHooks
from .._shutdown._stages import Move, Stage, Stages
from .._signals._escalation import Escalation, Observer, Step
from .._signals._relay import SignalRelay, ignored_warning
from ._lifecycle import Lifecycle, LifecycleState
from ._mainrun import MainEvents, MainRun
from ._probes import Probes
from ._programstatus import ProgramStatus
from ._services import ServiceStack

logger = library_logger("trio_graceful.runner")


def _log_failure(message: str, exc: BaseException | None, *, startup: bool) -> None:
    """Log a failure of the run, with ``message``.

    A failure after the program was ready is a bug to look into: its
    traceback is logged with it. A startup failure is most often the
    operator's to fix (a port in use, a missing file, a bad setting): one
    line says what it was, and the traceback goes to DEBUG, as do the
    summaries of the rollback that follows, whose lines would only bury it.
    """
    if not startup:
        logger.error("%s", message, exc_info=exc)
        return
    if exc is None:
        logger.error("%s", message)
    else:
        logger.error("%s: %s", message, one_line(exc))
        logger.debug("%s", message, exc_info=exc)
    log_as_news(-1)  # the rollback's bundles log at DEBUG


PID_1_WARNING: Final = (
    "running as PID 1: orphaned processes will not be reaped and signals "
    "without a handler are ignored; run the program under an init "
    "(docker run --init, or tini in the image's ENTRYPOINT)"
)
"""Logged at startup by a program that is the first process of its PID
namespace: a container without an init."""


@final
class Program:
    """One `trio_graceful.run` call (see the module docstring).

    Args:
        main: The async function to run, with ``args``.
        args: Its positional arguments.
        settings: What the run does.
        on_start: Called with the program first in the run's root task
            (makes `current_runner` work).
    """

    def __init__(
        self,
        main: Callable[..., Awaitable[object]],
        args: tuple[object, ...],
        settings: RunSettings,
        *,
        on_start: Callable[[Program], object],
    ) -> None:
        options = settings.options
        self._settings = settings
        self._on_start = on_start
        self.escalation = Escalation(options.second_signal)
        self.relay = SignalRelay(tuple(options.signals))
        self.watchdog = Watchdog(
            times=settings.times,
            signals=self.relay.handled,
            exit_codes=options.exit_codes,
            escalation=self.escalation,
        )
        self._gc = GcHold()
        self._probes = Probes(
            status=self.status,
            fail=lambda message: self.fail(message, None, startup=True),
            times=settings.times,
            health_port=options.health_port,
            health_host=options.health_host,
            health_max_connections=options.health_max_connections,
        )
        lifecycle = Lifecycle._create(settings.name)  # pyright: ignore[reportPrivateUsage]
        self._stages = Stages(lifecycle, self._probes.transitioned)
        self._main = MainRun(
            main,
            args,
            takes_task_status=settings.takes_task_status,
            startup_timeout=options.startup_timeout,
            events=MainEvents(
                ready=self._stages.become_ready,
                returned=lambda: self.begin_shutdown("main returned"),
                exited=lambda exc: self.exit_requested("main", exc),
                failed=self.fail,
                shutting_down=lambda: self._stages.shutting_down,
            ),
        )
        self._shutdown = Shutdown(
            times=settings.times,
            stages=self._stages,
            watchdog=self.watchdog,
            gc=self._gc,
            hooks=ShutdownHooks(
                ready=lambda: self._main.ready,
                stop_starting=self._stop_starting,
                draining=self._draining,
            ),
        )
        self.token: trio.lowlevel.TrioToken | None = None
        self._control: trio.Nursery | None = None
        self._root: Bundle | None = None
        self._services: ServiceStack | None = None
        self._ending = EndingRecorder(options.exit_codes)
        self._exit_code: int | None = None
        self._exit_line = ""
        # Name -> what it adds to the status now (Runner.status_detail).
        self.status_details: dict[str, Callable[[], object]] = {}

    # -- what the runner reads -------------------------------------------------------

    @property
    def settings(self) -> RunSettings:
        """What the run does: its options, name and stop times."""
        return self._settings

    @property
    def lifecycle(self) -> Lifecycle:
        """The program's lifecycle."""
        return self._stages.lifecycle

    @property
    def root(self) -> Bundle | None:
        """The root bundle, once it is open."""
        return self._root

    @property
    def services(self) -> ServiceStack | None:
        """The services, once their bundle is open."""
        return self._services

    @property
    def health_address(self) -> tuple[str, int] | None:
        """Where the health endpoint listens, once it does."""
        return self._probes.health_address

    def status(self) -> ProgramStatus:
        """The program's status now. Not a checkpoint; call it in the run's thread."""
        now = trio.current_time()
        stages = self._stages
        lifecycle = stages.lifecycle
        root, services = self._root, self._services
        return ProgramStatus(
            name=self._settings.name,
            state=lifecycle.state,
            reason=lifecycle.reason,
            ready=lifecycle.ready,
            live=lifecycle.state is not LifecycleState.TERMINATED,
            drain_delay_left=self._shutdown.drain_delay_left(now),
            grace_left=self._shutdown.grace_left(now),
            forced=stages.forced,
            tasks_running=0 if root is None else root.statistics().children_running,
            services_running=() if services is None else tuple(services.running),
            details={
                name: _detail(name, describe)
                for name, describe in self.status_details.items()
            },
        )

    # -- entry point ---------------------------------------------------------------

    def execute(self) -> int:
        """Run the program in this thread; return its exit status."""
        if os.getpid() == 1:
            # Reaping orphans here (waitpid(-1)) would take the exit
            # statuses that Trio waits for: that is an init's job.
            logger.warning("%s", PID_1_WARNING)
        for signum in self.relay.ignored:
            logger.warning("%s", ignored_warning(signum))
        self.watchdog.show_internals = show_internals()
        self.watchdog.start()
        try:
            with self.relay.installed(
                lambda previous, late: bound_the_exit(
                    previous, late, self._settings, self.escalation, self._exit_code
                )
            ):
                try:
                    trio.run(
                        self._root_task,
                        clock=self._settings.options.clock,
                        instruments=[self.watchdog.instrument],
                    )
                except BaseException as exc:
                    # As trio.run would raise it, not wrapped in our nurseries.
                    interrupt = interrupt_of(exc)
                    if interrupt is None:
                        raise
                    raise interrupt from None
        finally:
            self.watchdog.stop()
            self._gc.release()
        assert self._exit_code is not None
        # The run's last line. The process exits with this status unless a
        # later line says otherwise (an emergency exit, a signal after the run).
        logger.info("%s", self._exit_line)
        return self._exit_code

    async def _root_task(self) -> None:
        self._on_start(self)
        if self._settings.budget_warning is not None:
            logger.warning("%s", self._settings.budget_warning)
        # The bundles main opens ("root/<main>/connections") are the
        # program's own top level: their cancellations are news at INFO.
        log_as_news(2)
        self.token = trio.lowlevel.current_trio_token()
        self.watchdog.root_task = trio.lowlevel.current_task()
        with contextlib.ExitStack() as stack:
            async with trio.open_nursery() as control:
                self._control = control
                self._shutdown.attach(control)
                self._probes.start(control)
                root_closed = trio.Event()
                await control.start(self._run_services, root_closed, name="<services>")
                self._stages.start()
                if self.relay.handled:
                    self._connect_signals()
                    stack.callback(self.relay.disconnect)
                    stack.enter_context(self.watchdog.counting_signals())
                assert self._services is not None
                await self._probes.start_health_endpoint(self._services)
                await self._run_root_bundle(control)
                self._stages.move(Move.ROOT_CLOSED)
                root_closed.set()
        self._exit_code, self._exit_line = self._exit_status()
        self._stages.terminate(f"exit status {self._exit_code}")

    async def _run_services(
        self, root_closed: trio.Event, *, task_status: trio.TaskStatus[None]
    ) -> None:
        # In a task of its own, so that neither top-level bundle is inside
        # the other: both are named by their own names in the log.
        async with open_bundle(name="services") as services_bundle:
            self._services = ServiceStack(services_bundle, self._service_failed)
            task_status.started()
            await root_closed.wait()
            await self._services.stop(self._shutdown.deadline)
        self._stages.move(Move.SERVICES_CLOSED)
        assert self._control is not None
        self._control.cancel_scope.cancel()  # the end-of-grace observer

    # -- main and the root bundle ----------------------------------------------------

    async def _run_root_bundle(self, control: trio.Nursery) -> None:
        try:
            async with open_bundle(name="root") as root:
                self._root = root
                # A program asked to stop before it began does not begin.
                if not self._stages.shutting_down:
                    await self._main.start(root, control)
                await self._stages.wait_shutting_down()
                deadline = self._shutdown.deadline
                await root.shutdown(max(0.0, deadline - trio.current_time()))
        except BaseException as exc:
            self._root_raised(exc)

    def _root_raised(self, exc: BaseException) -> None:
        """A task on the root bundle raised: fail, or exit as SystemExit asks."""
        system_exit, failure = split_exits(exc)
        if failure is not None and not isinstance(failure, Exception):
            raise exc  # KeyboardInterrupt and the like end the run as in Trio
        if system_exit is not None:
            self.exit_requested("a task of the root bundle", system_exit)
        if failure is not None:
            self.fail("a task of the root bundle raised", failure)

    def _service_failed(self, name: str, exc: BaseException) -> None:
        if isinstance(exc, SystemExit):
            self.exit_requested(f"service {name!r}", exc)
        else:
            self.fail(f"service {name!r} raised", exc, startup=not self._main.ready)

    def exit_requested(self, who: str, exc: SystemExit) -> None:
        """Take the exit status from the first SystemExit; begin the shutdown."""
        self._ending.exited(exc)
        self.begin_shutdown(f"{who} raised SystemExit({exc.code!r})")

    def fail(
        self, message: str, exc: BaseException | None, startup: bool = False
    ) -> None:
        """Log a failure once, set the exit status, begin the shutdown.

        A startup failure's shutdown, which only rolls back, logs at DEBUG
        (see `_log_failure`).
        """
        _log_failure(message, exc, startup=startup)
        self._ending.failed(startup=startup)
        self._shutdown.begin(message, quiet=startup)

    # -- the shutdown's hooks ------------------------------------------------------

    def begin_shutdown(
        self, reason: str, *, signum: int | None = None, delay: bool = False
    ) -> bool:
        """Start the shutdown (see `Shutdown.begin`); False if it had begun."""
        return self._shutdown.begin(reason, signum=signum, delay=delay)

    def force(self, reason: str) -> None:
        """Hard-cancel what is draining now (see `Shutdown.force`)."""
        self._shutdown.force(reason)

    def _stop_starting(self) -> None:
        assert self._services is not None
        self._services.close(
            f"program {self._settings.name!r} is shutting down; "
            "no new services can be started"
        )
        self._main.cancel_startup()

    def _draining(self, stage: Stage) -> Bundle | None:
        if stage is Stage.FORCED_SERVICES and self._services is not None:
            return self._services.bundle
        return self._root

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
                # Named as the exit status will be, by the signal counted
                # first: with several pending, CPython runs the handlers in
                # the order of their numbers, while the watchdog reads them
                # from the wakeup fd in the order they came.
                first = self.escalation.first_signal or signum
                if not self.begin_shutdown(
                    signal_name(first), signum=first, delay=True
                ):
                    logger.warning(
                        "%s: already shutting down; send it again to force",
                        signal_name(first),
                    )
            elif step is Step.FORCE:
                self.force(f"{name} again")
            else:
                self.watchdog.do_step(step, signum)

    # -- helpers -----------------------------------------------------------------------

    def _exit_status(self) -> tuple[int, str]:
        forced_by: Literal["grace", "signal"] | None = None
        if self._stages.forced:
            forced_by = "signal" if self.escalation.level >= 2 else "grace"
        return self._ending.exit_status(
            first_signal=self.escalation.first_signal, forced_by=forced_by
        )


def _detail(name: str, describe: Callable[[], object]) -> object:
    """What ``describe`` says now; if it raises, the error, logged.

    The status is asked for at each lifecycle move and probe: a part's bug
    must not stop them.
    """
    try:
        return describe()
    except Exception as exc:
        logger.exception("the status detail %r failed", name)
        return {"error": one_line(exc)}
