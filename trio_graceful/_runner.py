"""`run`: a Trio program's entry point, with signals, stages and an emergency exit.

The tree of a run (``name`` defaults to the name of ``main``)::

    root task
    ├── "<signal handler>"        counts signals, starts and forces shutdowns
    ├── "<shutdown deadline>"     forces the shutdown when the grace runs out
    └── bundle "<name>"           the services, started in order by main
        ├── service, service ...
        └── (body) bundle "root"  Runner.root
            └── main, and the tasks main starts there

A shutdown, whatever starts it (a signal, `Runner.request_shutdown`, ``main``
returning or failing), runs in this order under one deadline, ``grace``
seconds after it began:

1. ``Runner.root.shutdown(grace)``: STOP to the root bundle's inboxes, then
   wait for ``main`` and its tasks, hard-cancelling them at the deadline;
2. the services in reverse start order, each getting STOP once the ones
   after it have ended, hard-cancelled at the same deadline.

Escalation counts signals: the first starts the shutdown, the second forces it
(hard cancel at once), the third is left to the watchdog thread, which exits
the process at once (see ``_watchdog``); so does a forced shutdown that has
not unwound within the unwind budget.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import inspect
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Generator,
)
from contextlib import AbstractAsyncContextManager
from types import FrameType
from typing import TYPE_CHECKING, Any, Final, Literal, NoReturn, TypeVar, cast, final

import attrs
import trio

from ._bundle import Bundle, open_bundle
from ._exitcodes import ExitCodes
from ._lifecycle import Event, Lifecycle, LifecycleState
from ._services import ServiceStack
from ._util import (
    ForwardingTaskStatus,
    NoPublicConstructor,
    check_name,
    check_seconds,
    in_trio_run,
    signal_name,
)
from ._watchdog import Watchdog

if TYPE_CHECKING:
    from typing_extensions import TypeVarTuple, Unpack

    PosArgT = TypeVarTuple("PosArgT")

logger = logging.getLogger("trio_graceful.runner")

T = TypeVar("T")

DEFAULT_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)
# The collector's third threshold during a shutdown: full collections come
# after this many collections of the middle generation, that is, not at all.
_NO_FULL_COLLECTIONS: Final = 1_000_000
DEFAULT_EXIT_CODES: Final = ExitCodes()

_current: contextvars.ContextVar[Runner] = contextvars.ContextVar(
    "trio_graceful.current_runner"
)

# Signals whose handlers cannot be changed.
_UNCATCHABLE: Final = frozenset({signal.SIGKILL, signal.SIGSTOP})


def current_runner() -> Runner:
    """Return the `Runner` of the `trio_graceful.run` call this task belongs to.

    Works in every task of the run (and in threads started with
    `trio.to_thread.run_sync`, which inherit the task's context). Not a
    checkpoint.

    Raises:
        RuntimeError: if not called from within `trio_graceful.run`.
    """
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError(
            "current_runner() was called outside trio_graceful.run(); "
            "it only works in the tasks of a program started with it"
        ) from None


def _format_grace(grace: float) -> str:
    return "no time limit" if grace == math.inf else f"grace {grace:g} s"


def _takes_task_status(fn: Callable[..., object]) -> bool:
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins and other opaque callables
        return False
    parameter = parameters.get("task_status")
    return parameter is not None and parameter.kind in (
        inspect.Parameter.KEYWORD_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )


def _check_signals(signals: object) -> tuple[int, ...]:
    if isinstance(signals, (int, str, bytes)) or not isinstance(signals, Collection):
        raise TypeError(f"signals must be a collection of signals, not {signals!r}")
    result: list[int] = []
    for item in signals:  # pyright: ignore[reportUnknownVariableType]
        if isinstance(item, bool) or not isinstance(item, int):
            raise TypeError(f"signals must hold signal numbers, not {item!r}")
        if item in _UNCATCHABLE or item not in signal.valid_signals():
            raise ValueError(
                f"signals must be signals that can be handled, not {item!r}"
            )
        if item not in result:
            result.append(int(item))
    return tuple(result)


@final
@attrs.define(eq=False, repr=False, slots=False)
class Runner(metaclass=NoPublicConstructor):
    """The program that `trio_graceful.run` runs; get it with `current_runner`.

    It gives ``main`` what it needs to take part in the shutdown: the `root`
    bundle to open an inbox on (STOP arrives there when the shutdown begins),
    the `lifecycle`, `start_service` and `enter_resource` for the parts that
    must start before ``main`` is ready and stop after it, and
    `request_shutdown`.
    """

    _run: _Run

    def __repr__(self) -> str:
        return (
            f"<trio_graceful.Runner {self._run.name!r} "
            f"{self._run.lifecycle.state.value}>"
        )

    @property
    def name(self) -> str:
        """The program's name (the ``name`` given to `trio_graceful.run`)."""
        return self._run.name

    @property
    def grace(self) -> float:
        """The grace period of the shutdown, in seconds."""
        return self._run.grace

    @property
    def lifecycle(self) -> Lifecycle:
        """The program's `Lifecycle`, which tells its state and waits for one."""
        return self._run.lifecycle

    @property
    def root(self) -> Bundle:
        """The bundle ``main`` runs in.

        The shutdown calls `Bundle.shutdown` on it: an inbox opened with
        ``runner.root.open_inbox()`` gets `STOP` when the shutdown begins,
        and tasks started with ``runner.root.start_soon`` are stopped along
        with ``main``, before the services.
        """
        root = self._run.root
        assert root is not None  # main and its tasks only run once it exists
        return root

    def request_shutdown(self, reason: str = "requested") -> None:
        """Begin the graceful shutdown, as the first signal would.

        Does nothing if the shutdown has already begun. The exit status is
        `ExitCodes.ok` unless something fails. Not a checkpoint.

        Args:
            reason (str): Why, for the log and `Lifecycle.reason`.

        Raises:
            TypeError: if ``reason`` is not a string.
            RuntimeError: if called from another thread; use
                ``trio.from_thread.run_sync(runner.request_shutdown)``.
        """
        if not isinstance(cast("object", reason), str):
            raise TypeError(f"reason must be a string, not {reason!r}")
        self._run.check_thread("request_shutdown")
        self._run.begin_shutdown(reason)

    async def start_service(
        self,
        async_fn: Callable[..., Awaitable[object]],
        *args: object,
        name: str | None = None,
    ) -> Any:
        """Start a service and wait until it is ready.

        A service runs ``await async_fn(inbox, *args, task_status=...)``: it
        gets an inbox of its own, calls ``task_status.started(value)`` when it
        is ready, and ends when `STOP` arrives in its inbox. Services stop
        after ``main`` and its root bundle, in the reverse order of their
        start, each getting STOP once the ones started after it have ended;
        the shutdown's one deadline hard-cancels what is left.

        Called while the program starts, the service's startup counts against
        the runner's ``startup_timeout``, and an error makes the startup fail
        (unless ``main`` catches it): the services already started are then
        stopped, in reverse order. A service that raises once ready makes the
        program shut down with `ExitCodes.error`. This is a checkpoint.

        Args:
            async_fn: The service's async function.
            *args: Positional arguments passed after the inbox.
            name (str or None): The service's task name; defaults to the
                function's qualified name.

        Returns:
            What the service passed to ``task_status.started()``.

        Raises:
            RuntimeError: if the shutdown has begun.
            Exception: whatever the service raised before it was ready.
        """
        services = self._run.services
        assert services is not None
        return await services.start(async_fn, args, name)

    async def enter_resource(
        self, manager: AbstractAsyncContextManager[T], *, name: str | None = None
    ) -> T:
        """Enter an async context manager now and exit it during the shutdown.

        The resource takes its place among the services (see
        `start_service`): it is exited after the services started after it
        have stopped, so a database connection opened first is closed last.
        This is a checkpoint.

        Args:
            manager: The async context manager, such as ``open_database()``.
            name (str or None): Its name in the task tree; defaults to the
                manager's class name.

        Returns:
            What entering ``manager`` gave (the ``as`` target).

        Raises:
            TypeError: if ``manager`` is not an async context manager.
            RuntimeError: if the shutdown has begun.
            Exception: whatever entering the manager raised.
        """
        services = self._run.services
        assert services is not None
        return await services.enter(manager, name)


class _Run:
    """The state of one `run` call; `Runner` is its public face."""

    def __init__(
        self,
        main: Callable[..., Awaitable[object]],
        args: tuple[object, ...],
        *,
        name: str,
        grace: float,
        unwind_budget: float,
        startup_timeout: float,
        signals: tuple[int, ...],
        exit_codes: ExitCodes,
        takes_task_status: bool,
        second_signal: Literal["force", "exit"] = "force",
    ) -> None:
        self.main = main
        self.args = args
        self.name = name
        self.grace = grace
        self.unwind_budget = unwind_budget
        self.startup_timeout = startup_timeout
        self.signals = signals
        self.exit_codes = exit_codes
        self.takes_task_status = takes_task_status
        self.second_signal = second_signal
        self.lifecycle: Lifecycle = Lifecycle._create(name)  # pyright: ignore[reportPrivateUsage]
        self.runner: Runner = Runner._create(self)  # pyright: ignore[reportPrivateUsage]
        self.watchdog = Watchdog(
            grace=grace,
            unwind_budget=unwind_budget,
            signals=signals,
            exit_code=exit_codes.emergency,
        )
        self.token: trio.lowlevel.TrioToken | None = None
        self.control: trio.Nursery | None = None
        self.root: Bundle | None = None
        self.services: ServiceStack | None = None
        self.services_bundle: Bundle | None = None
        self.startup_scope: trio.CancelScope | None = None
        self.startup_timer_scope = trio.CancelScope()
        self.main_ready = False
        self.shutdown_requested = trio.Event()
        self.deadline = math.inf
        self.forced = False
        self.paused_gc = False
        # The collector's thresholds before the shutdown put off its full
        # collections; None if it did not.
        self.gc_thresholds: tuple[int, int, int] | None = None
        self.stopping_services = False
        self.signal_count = 0
        self.first_signal: int | None = None
        self.failure_status: int | None = None
        self.system_exit: tuple[object] | None = None
        self.status: int | None = None
        # Signals that reached the handler run() installs around trio.run:
        # before the Trio-side handling starts, or after it has ended.
        self.outside_signals: list[int] = []

    # -- entry point ---------------------------------------------------------------

    def execute(self, clock: trio.abc.Clock | None) -> int:
        self.watchdog.start()
        try:
            with self._outside_handlers():
                trio.run(self._root_task, clock=clock)
                for signum in self.outside_signals:
                    logger.info(
                        "%s received while exiting; ignored", signal_name(signum)
                    )
        finally:
            self.watchdog.stop()
            if self.paused_gc:
                gc.enable()
            if self.gc_thresholds is not None:
                gc.set_threshold(*self.gc_thresholds)
        assert self.status is not None
        return self.status

    @contextlib.contextmanager
    def _outside_handlers(self) -> Generator[None, None, None]:
        # Installed before trio.run, they catch the signals that arrive before
        # the run's own handling starts or after it ends. They also keep
        # Trio from installing its KeyboardInterrupt handler.
        def record(signum: int, frame: FrameType | None) -> None:
            self.outside_signals.append(signum)

        previous: dict[int, Any] = {}
        try:
            for signum in self.signals:
                previous[signum] = signal.signal(signum, record)
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    async def _root_task(self) -> None:
        _current.set(self.runner)
        self.token = trio.lowlevel.current_trio_token()
        self.watchdog.root_task = trio.lowlevel.current_task()
        with contextlib.ExitStack() as stack:
            receiver = None
            if self.signals:
                # A signal in the instant between these two lines reaches
                # Trio but not the watchdog's count: the third signal would
                # then have to be a fourth (the unwind budget still holds).
                receiver = stack.enter_context(trio.open_signal_receiver(*self.signals))
                stack.enter_context(self.watchdog.counting_signals())
            async with trio.open_nursery() as control:
                self.control = control
                async with open_bundle(name=self.name) as services_bundle:
                    self.services_bundle = services_bundle
                    self.services = ServiceStack(services_bundle, self._service_failed)
                    self.transition(Event.START, "")
                    # Signals that came until now waited in the receiver.
                    if receiver is not None:
                        control.start_soon(
                            self._handle_signals, receiver, name="<signal handler>"
                        )
                    await self._run_root_bundle()
                    self.stopping_services = True
                    await self.services.stop(self.deadline)
                control.cancel_scope.cancel()
        self.status = self._exit_status()
        self.transition(Event.TERMINATE, f"exit status {self.status}")

    # -- main and the root bundle ----------------------------------------------------

    async def _run_root_bundle(self) -> None:
        try:
            async with open_bundle(name="root") as root:
                self.root = root
                # A program asked to stop before it began does not begin.
                if not self.shutdown_requested.is_set():
                    await self._start_main(root)
                await self.shutdown_requested.wait()
                await root.shutdown(max(0.0, self.deadline - trio.current_time()))
        except Exception as exc:
            # A task that main started on the root bundle raised.
            self.fail("a task of the root bundle raised", exc)

    async def _start_main(self, root: Bundle) -> None:
        main_name = getattr(self.main, "__qualname__", "main")
        if not self.takes_task_status:
            root.start_soon(self._main_task, name=main_name)
            self._main_became_ready()
            return
        assert self.control is not None
        with trio.CancelScope() as self.startup_scope:
            if self.startup_timeout != math.inf:
                self.control.start_soon(
                    self._startup_timer,
                    trio.current_time() + self.startup_timeout,
                    name="<startup timeout>",
                )
            try:
                await root.start(self._main_task, name=main_name)
            except Exception as exc:
                # Failures of main's own making were recorded by _main_task.
                if not self.shutdown_requested.is_set():
                    self.fail("startup failed", exc, startup=True)
        self.startup_scope = None

    async def _startup_timer(self, deadline: float) -> None:
        # A timer rather than a deadline on the startup scope, so that the
        # shutdown has begun when main sees the cancellation, as for a signal.
        with self.startup_timer_scope:
            await trio.sleep_until(deadline)
        if not self.main_ready and not self.shutdown_requested.is_set():
            self.fail(
                f"startup failed: main was not ready within {self.startup_timeout:g} s",
                None,
                startup=True,
            )

    async def _main_task(
        self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
    ) -> None:
        status = ForwardingTaskStatus(task_status, self._main_became_ready)
        try:
            if self.takes_task_status:
                result = await self.main(*self.args, task_status=status)
            else:
                result = await self.main(*self.args)
        except SystemExit as exc:
            self.system_exit = (exc.code,)
            self.begin_shutdown(f"main raised SystemExit({exc.code!r})")
            return
        except Exception as exc:
            if self.takes_task_status and not status.started_called:
                raise  # root.start() raises it: the startup failed
            self.fail("main raised", exc)
            return
        if self.takes_task_status and not status.started_called:
            self.fail(
                "startup failed: main returned without calling task_status.started()",
                None,
                startup=True,
            )
        elif result is not None:
            self.fail(
                f"main returned {result!r}; it must return None (raise "
                f"SystemExit(status) to choose the exit status)",
                None,
            )
        else:
            self.begin_shutdown("main returned")

    def _main_became_ready(self) -> None:
        self.main_ready = True
        self.startup_timer_scope.cancel()
        if self.lifecycle.state is LifecycleState.STARTING:
            self.transition(Event.BECOME_READY, "main is ready")

    def _service_failed(self, name: str, exc: Exception) -> None:
        self.fail(f"service {name!r} raised", exc, startup=not self.main_ready)

    # -- shutdown --------------------------------------------------------------------

    def begin_shutdown(self, reason: str, *, signum: int | None = None) -> bool:
        """Start the shutdown; False if it had already begun."""
        if self.shutdown_requested.is_set():
            return False
        self.deadline = trio.current_time() + self.grace
        self.transition(Event.SHUT_DOWN, reason)
        self.shutdown_requested.set()
        assert self.services is not None
        self.services.close(
            f"program {self.name!r} is shutting down; no new services can be started"
        )
        if self.startup_scope is not None and not self.main_ready:
            self.startup_scope.cancel("the shutdown began during startup")
        self.watchdog.shutdown_began()
        # What the program built before its shutdown is long-lived; full
        # collections during the drain would walk all of it again and again
        # (1,000 WebSocket connections of the example server were all closed
        # in 0.2 s instead of 0.3 without them). Young garbage is still
        # collected; run() restores the thresholds.
        thresholds = gc.get_threshold()
        if thresholds[0] > 0:  # 0: the program turned automatic collection off
            self.gc_thresholds = thresholds
            gc.set_threshold(thresholds[0], thresholds[1], _NO_FULL_COLLECTIONS)
        if signum is not None:
            logger.warning(
                "%s: shutting down (%s)", signal_name(signum), _format_grace(self.grace)
            )
        else:
            logger.info("shutting down (%s): %s", _format_grace(self.grace), reason)
        assert self.control is not None
        self.control.start_soon(self._force_at_deadline, name="<shutdown deadline>")
        return True

    async def _force_at_deadline(self) -> None:
        await trio.sleep_until(self.deadline)
        self.force(f"the {_format_grace(self.grace)} ran out")

    def force(self, reason: str) -> None:
        """Hard-cancel everything now; the unwind budget starts."""
        if self.forced:
            return
        self.forced = True
        self.deadline = min(self.deadline, trio.current_time())
        # The program is ending: collecting garbage while thousands of tasks
        # unwind only delays that (1,000 WebSocket connections unwound in
        # 0.35 s instead of 0.8 s). run() turns the collector back on.
        if gc.isenabled():
            gc.disable()
            self.paused_gc = True
        logger.warning("forcing: %s", reason)
        self.watchdog.hard_cancel_began()
        assert self.control is not None
        # The services outlive main even now (main's unwinding may use them):
        # they are hard-cancelled once it is over, or now if they are
        # already being stopped.
        bundle = self.services_bundle if self.stopping_services else self.root
        if bundle is not None and not bundle.closed:
            self.control.start_soon(
                bundle.cancel, 0, name=f"<hard cancel of {bundle.name!r}>"
            )

    def _exit_at_once(self, reason: str) -> NoReturn:
        assert self.first_signal is not None
        status = self.exit_codes.after_signal(self.first_signal, forced=True)
        logger.warning("exiting at once: %s", reason)
        logging.shutdown()  # flush what has been logged
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status)

    def fail(
        self, message: str, exc: BaseException | None, *, startup: bool = False
    ) -> None:
        """Log a failure once, set the exit status, begin the shutdown."""
        logger.error("%s", message, exc_info=exc)
        if self.failure_status is None:
            codes = self.exit_codes
            self.failure_status = codes.startup_failed if startup else codes.error
        self.begin_shutdown(message)

    # -- signals ---------------------------------------------------------------------

    async def _handle_signals(self, receiver: AsyncIterator[int]) -> None:
        # Signals that came before the receiver was open: the watchdog did
        # not see them through the wakeup fd, so count them for it too.
        while self.outside_signals:
            signum = self.outside_signals.pop(0)
            self.watchdog.count_signal(signum)
            self._on_signal(signum)
        async for signum in receiver:
            self._on_signal(signum)

    def _on_signal(self, signum: int) -> None:
        self.signal_count += 1
        if self.first_signal is None:
            self.first_signal = signum
        name = signal_name(signum)
        if self.signal_count == 1:
            if not self.begin_shutdown(name, signum=signum):
                logger.warning(
                    "%s: already shutting down; send it again to force", name
                )
        elif self.signal_count == 2:
            if self.second_signal == "exit":
                self._exit_at_once(f"{name} again")
            self.force(f"{name} again")
        # The third one is the watchdog's: it exits the process.

    # -- helpers -----------------------------------------------------------------------

    def transition(self, event: Event, reason: str) -> None:
        self.lifecycle._transition(event, reason)  # pyright: ignore[reportPrivateUsage]

    def check_thread(self, method: str) -> None:
        if not in_trio_run(self.token):
            raise RuntimeError(
                f"Runner.{method}() must be called from the Trio thread of "
                f"program {self.name!r}; from another thread use "
                f"trio.from_thread.run_sync(runner.{method})"
            )

    def _exit_status(self) -> int:
        codes = self.exit_codes
        if self.failure_status is not None:
            return self.failure_status
        if self.system_exit is not None:
            (code,) = self.system_exit
            if code is None:
                return codes.ok
            if isinstance(code, int):
                return code
            # As Python does for SystemExit("message").
            logger.error("%s", code)
            return codes.error
        if self.first_signal is not None:
            return codes.after_signal(
                self.first_signal,
                forced=self.forced,
                # Forced, but by the deadline alone: no second signal came.
                grace_ran_out=self.forced and self.signal_count < 2,
            )
        return codes.ok


def run(
    main: Callable[[Unpack[PosArgT]], Awaitable[None]],
    *args: Unpack[PosArgT],
    grace: float = 10.0,
    unwind_budget: float = 3.0,
    startup_timeout: float = math.inf,
    signals: Collection[int] = DEFAULT_SIGNALS,
    exit_codes: ExitCodes = DEFAULT_EXIT_CODES,
    clock: trio.abc.Clock | None = None,
    name: str | None = None,
    second_signal: Literal["force", "exit"] = "force",
) -> int:
    """Run ``main(*args)`` as a program that shuts down well; return its exit status.

    Like `trio.run`, but for programs that must stop well: services, servers,
    stdio tools. ``main`` runs as a child of a root bundle (`Runner.root`;
    get the runner with `current_runner`). If ``main`` takes a
    ``task_status`` argument, the program is *starting* until it calls
    ``task_status.started()``, then *ready*; otherwise it is ready at once.
    Give ``task_status`` Trio's usual default, ``trio.TASK_STATUS_IGNORED``,
    so that type checkers accept ``main``; a value passed to ``started()``
    is not used.

    The first of ``signals`` (SIGINT and SIGTERM by default) begins a
    graceful shutdown: `STOP` to the root bundle's inboxes, then
    ``cancel(grace)``, then the services in reverse order, all within
    ``grace`` seconds. The second signal hard-cancels everything at once. The
    third, or a hard cancel that has not unwound within ``unwind_budget``
    seconds, ends the process with ``os._exit`` from a watchdog thread (which
    works even if the Trio thread is stuck in a blocking call), after writing
    to stderr which tasks were still running and where they waited. Each
    stage logs one line on the ``trio_graceful.runner`` logger; a signal
    never becomes a `KeyboardInterrupt`. During the shutdown the garbage
    collector's full collections are put off and, once the shutdown is
    forced, the collector is paused; both are undone before `run` returns.

    The program also shuts down when ``main`` returns or raises, when a
    service raises, or on `Runner.request_shutdown`. The exit status is
    chosen as `ExitCodes` describes; pass it to `sys.exit`::

        if __name__ == "__main__":
            sys.exit(trio_graceful.run(main, grace=5))

    Args:
        main: The async function to run; it must return None.
        *args: Positional arguments for ``main``.
        grace (float): Seconds the graceful shutdown may take before the
            hard cancel.
        unwind_budget (float): Seconds a hard cancel may take to unwind
            before the emergency exit.
        startup_timeout (float): Seconds ``main`` may take to call
            ``task_status.started()``; when they are up, the startup fails.
            Only for a ``main`` that takes ``task_status``.
        signals (collections.abc.Collection[int]): The signals that shut
            the program down; empty to handle none (the process then keeps
            the default handlers, and a `KeyboardInterrupt` is possible
            again).
        exit_codes (ExitCodes): The exit statuses to return.
        clock (trio.abc.Clock or None): Passed to `trio.run`, such as
            `trio.testing.MockClock` in tests. The watchdog always uses real
            time.
        name (str or None): The program's name, for the lifecycle, the log and
            the services' bundle; defaults to ``main``'s name.
        second_signal (str): What the second signal does. ``"force"`` (the
            default) hard-cancels everything and lets it unwind: ``finally``
            blocks run and the log is complete, within ``unwind_budget``.
            ``"exit"`` ends the process at once with ``os._exit`` (the
            status of a forced shutdown), after flushing the log: for a
            server with thousands of connections, whose unwinding takes
            longer than anyone pressing Ctrl+C twice wants to wait. The
            operating system closes what the process held.

    Returns:
        int: The exit status.

    Raises:
        TypeError: for an argument of the wrong type.
        ValueError: for a negative or NaN duration, a signal that cannot be
            handled, a ``startup_timeout`` for a ``main`` without
            ``task_status``, or a ``second_signal`` other than ``"force"`` and
            ``"exit"``.
        RuntimeError: if signals are to be handled and this is not the main
            thread, or if called from inside a Trio run.
    """
    grace = check_seconds("grace", grace)
    unwind_budget = check_seconds("unwind_budget", unwind_budget)
    startup_timeout = check_seconds("startup_timeout", startup_timeout)
    checked_signals = _check_signals(signals)
    if not callable(main):
        raise TypeError(f"main must be an async function, not {main!r}")
    if not isinstance(cast("object", exit_codes), ExitCodes):
        raise TypeError(f"exit_codes must be an ExitCodes, not {exit_codes!r}")
    check_name(name)
    if second_signal not in ("force", "exit"):
        raise ValueError(
            f'second_signal must be "force" or "exit", not {second_signal!r}'
        )
    program = name if name is not None else str(getattr(main, "__name__", "main"))
    takes_task_status = _takes_task_status(main)
    if startup_timeout != math.inf and not takes_task_status:
        raise ValueError(
            f"startup_timeout={startup_timeout:g} needs a main that takes "
            f"task_status and calls task_status.started() when it is ready"
        )
    if checked_signals and threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "trio_graceful.run() must be called from the main thread to handle "
            "signals; pass signals=() to run it in another thread"
        )
    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        pass
    else:
        raise RuntimeError(
            "trio_graceful.run() was called from inside a Trio run; "
            "it starts a run of its own"
        )
    return _Run(
        main,
        args,
        name=program,
        grace=grace,
        unwind_budget=unwind_budget,
        startup_timeout=startup_timeout,
        signals=checked_signals,
        exit_codes=exit_codes,
        takes_task_status=takes_task_status,
        second_signal=second_signal,
    ).execute(clock)
