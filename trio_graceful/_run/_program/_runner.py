"""`run`: a Trio program's entry point, and `Runner`, the program's face to its tasks.

`run` checks its arguments (``_runoptions.RunOptions``, where each one's
default and check are defined) and hands the run to a
``_program.Program``, which holds its stages, signals and shutdown; the tasks
of the run reach it as the `Runner` that `current_runner` returns.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Awaitable, Callable, Collection, Generator
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Literal, TypeVar, final, overload

import attrs
import trio

from ..._core._bundle import Bundle
from ..._core._checks import check_string
from ..._core._lowlevel import NoPublicConstructor, in_run_of
from .._exit._status import ExitCodes
from .._options._runoptions import DEFAULT_OPTIONS, RunOptions, settle
from ._lifecycle import Lifecycle
from ._program import Program
from ._programstatus import ProgramStatus

if TYPE_CHECKING:
    from typing_extensions import TypeVarTuple, Unpack

    from ._services import Service0, Service1, Service2, Service3

    PosArgT = TypeVarTuple("PosArgT")
    StatusT = TypeVar("StatusT")
    A1 = TypeVar("A1")
    A2 = TypeVar("A2")
    A3 = TypeVar("A3")

T = TypeVar("T")

_current: contextvars.ContextVar[Runner] = contextvars.ContextVar(
    "trio_graceful.current_runner"
)


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

    _run: Program

    def __repr__(self) -> str:
        return (
            f"<trio_graceful.Runner {self._run.settings.name!r} "
            f"{self._run.lifecycle.state.value}>"
        )

    @property
    def name(self) -> str:
        """The program's name (the ``name`` given to `trio_graceful.run`)."""
        return self._run.settings.name

    @property
    def grace(self) -> float:
        """The grace period of the shutdown, in seconds."""
        return self._run.settings.times.grace

    @property
    def drain_delay(self) -> float:
        """Seconds the program serves on, withdrawn, before the shutdown proper."""
        return self._run.settings.times.drain_delay

    @property
    def health_address(self) -> tuple[str, int] | None:
        """The ``(host, port)`` the health endpoint listens on; None without one.

        With ``health_port=0`` this is where to find the port the system chose
        (give a ``health_host`` too: on every interface, IPv4 and IPv6 would
        each get a port of their own, and this names the first).
        """
        return self._run.health_address

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

    def status(self) -> ProgramStatus:
        """Return a snapshot of the program's state and of its shutdown's progress.

        What the health endpoint serves at ``/statusz``. Not a checkpoint.

        Raises:
            RuntimeError: if called from another thread; use
                ``trio.from_thread.run_sync(runner.status)``.
        """
        self._check_thread("status")
        return self._run.status()

    @contextlib.contextmanager
    def status_detail(
        self, name: str, describe: Callable[[], object]
    ) -> Generator[None]:
        """Add ``describe()`` to the program's status, as ``name``, for the block.

        `status` calls ``describe`` each time it is asked for, and puts what it
        returns in `ProgramStatus.details`; ``/statusz`` shows it under
        ``name``. It must return JSON-able values at once, without blocking;
        if it raises, the error is logged and the detail is ``{"error":
        "..."}`` (the exception's last line). A service uses it
        to say what only it knows (`trio_graceful.workers.serve_workers` lists
        its workers). Not a checkpoint.

        Raises:
            TypeError: if ``name`` is not a string or ``describe`` not callable.
            ValueError: if ``name`` is empty, a field of `ProgramStatus`, or
                given by another block that has not ended.
            RuntimeError: if called from another thread.
        """
        self._check_thread("status_detail")
        check_string("name", name)
        if not callable(describe):
            raise TypeError(f"describe must be a callable, not {describe!r}")
        details = self._run.status_details
        if not name or name in attrs.fields_dict(ProgramStatus):
            raise ValueError(f"name must be a new key of /statusz, not {name!r}")
        if name in details:
            raise ValueError(f"a status detail named {name!r} is given already")
        details[name] = describe
        try:
            yield
        finally:
            del details[name]

    def request_shutdown(self, reason: str = "requested") -> None:
        """Begin the graceful shutdown, as the first signal would.

        Like the signal, it withdraws a ready program for the drain delay
        first. Does nothing if the shutdown has already begun. The exit status is
        `ExitCodes.ok` unless something fails. Not a checkpoint.

        Args:
            reason (str): Why, for the log and `Lifecycle.reason`.

        Raises:
            TypeError: if ``reason`` is not a string.
            RuntimeError: if called from another thread; use
                ``trio.from_thread.run_sync(runner.request_shutdown)``.
        """
        check_string("reason", reason)
        self._check_thread("request_shutdown")
        self._run.begin_shutdown(reason, delay=True)

    def _check_thread(self, method: str) -> None:
        if not in_run_of(self._run.token):
            raise RuntimeError(
                f"Runner.{method}() must be called from the Trio thread of "
                f"program {self.name!r}; from another thread use "
                f"trio.from_thread.run_sync(runner.{method})"
            )

    @overload
    async def start_service(
        self, async_fn: Service0[StatusT], /, *, name: str | None = None
    ) -> StatusT: ...
    @overload
    async def start_service(
        self, async_fn: Service1[A1, StatusT], a1: A1, /, *, name: str | None = None
    ) -> StatusT: ...
    @overload
    async def start_service(
        self,
        async_fn: Service2[A1, A2, StatusT],
        a1: A1,
        a2: A2,
        /,
        *,
        name: str | None = None,
    ) -> StatusT: ...
    @overload
    async def start_service(
        self,
        async_fn: Service3[A1, A2, A3, StatusT],
        a1: A1,
        a2: A2,
        a3: A3,
        /,
        *,
        name: str | None = None,
    ) -> StatusT: ...
    async def start_service(
        self,
        async_fn: Callable[..., Awaitable[object]],
        /,
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
        program shut down with `ExitCodes.error`. If this call is cancelled
        before the service is ready (a signal during the startup), the
        service gets STOP, not a hard cancel, and is stopped in its place
        among the others under the shutdown's deadline; an error it raises
        then is the service's failure. This is a checkpoint.

        Args:
            async_fn: The service's async function.
            *args: Positional arguments passed after the inbox.
            name (str or None): The service's task name; defaults to the
                function's qualified name.

        Returns:
            What the service passed to ``task_status.started()``, typed as
            its ``task_status: trio.TaskStatus[T]`` says. Type checkers check
            up to three arguments after the inbox; pass more with
            `functools.partial` (pyright still infers the result; mypy's
            partial gives Any).

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


def run(
    main: Callable[[Unpack[PosArgT]], Awaitable[None]],
    *args: Unpack[PosArgT],
    grace: float = DEFAULT_OPTIONS.grace,
    unwind_budget: float = DEFAULT_OPTIONS.unwind_budget,
    startup_timeout: float = DEFAULT_OPTIONS.startup_timeout,
    signals: Collection[int] = DEFAULT_OPTIONS.signals,
    exit_codes: ExitCodes = DEFAULT_OPTIONS.exit_codes,
    clock: trio.abc.Clock | None = DEFAULT_OPTIONS.clock,
    name: str | None = DEFAULT_OPTIONS.name,
    second_signal: Literal["force", "exit"] = DEFAULT_OPTIONS.second_signal,
    drain_delay: float = DEFAULT_OPTIONS.drain_delay,
    stop_budget: float = DEFAULT_OPTIONS.stop_budget,
    health_port: int | None = DEFAULT_OPTIONS.health_port,
    health_host: str | None = DEFAULT_OPTIONS.health_host,
    health_max_connections: int = DEFAULT_OPTIONS.health_max_connections,
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
    never becomes a `KeyboardInterrupt`. Once `run` has taken a signal, the
    process ends within the stop time of the first one (``drain_delay +
    grace + unwind_budget``), even if a thread that is not a daemon never
    ends: the interpreter's exit is cut short then, naming the threads it
    waited for; and a signal that comes once the run is over, within that
    time, ends the process at once with ``128 + n``. A program that goes on
    after `run` returned is not cut short, and gets its previous handlers
    back once the stop time is over (see :doc:`runner`). A signal the
    process ignores when `run` starts (an inherited ``SIG_IGN``) stays
    ignored, and a warning at startup says so. During the
    shutdown the garbage collector's full collections are put off and, once
    the shutdown is forced, the collector is paused; both are undone when the
    last run that needed them returns.

    The program also shuts down when ``main`` returns or raises, when a
    service raises, or on `Runner.request_shutdown`. The exit status is
    chosen as `ExitCodes` describes; pass it to `sys.exit`::

        if __name__ == "__main__":
            sys.exit(trio_graceful.run(main, grace=5))

    Args:
        main: The async function to run (an ``async def`` function, or a
            `functools.partial` of one); it must return None.
        *args: Positional arguments for ``main``.
        grace (float): Seconds the graceful shutdown may take before the
            hard cancel; `math.inf` for no limit.
        unwind_budget (float): Seconds a hard cancel may take to unwind
            before the emergency exit.
        startup_timeout (float): Seconds ``main`` may take to call
            ``task_status.started()``; when they are up, the startup fails.
            Only for a ``main`` that takes ``task_status``.
        signals (collections.abc.Collection[int]): The signals that shut
            the program down; empty to handle none (the process then keeps
            the default handlers, and a `KeyboardInterrupt` is possible
            again: it leaves `run` as it would leave `trio.run`).
        exit_codes (ExitCodes): The exit statuses to return.
        clock (trio.abc.Clock or None): Passed to `trio.run`, such as
            `trio.testing.MockClock` in tests. The watchdog always uses real
            time.
        name (str or None): The program's name, for the lifecycle and the
            log; defaults to ``main``'s name.
        drain_delay (float): Seconds a ready program keeps serving after the
            first signal (or `Runner.request_shutdown`), no longer ready
            (`LifecycleState.WITHDRAWN`), before STOP and the grace begin:
            the time a load balancer needs to stop sending it new
            connections. A second signal during the delay hard-cancels as
            usual. A program that is not ready yet, or whose ``main`` returns
            or fails, skips it.
        stop_budget (float): The time the orchestrator allows between its
            stop signal and SIGKILL (Kubernetes'
            ``terminationGracePeriodSeconds``, systemd's ``TimeoutStopSec``).
            If ``drain_delay + grace + unwind_budget``, plus the 2 s the
            emergency exit may take, exceeds it, a warning states the sum at
            startup and the grace is shortened to fit (then the drain delay,
            then the unwind budget).
        health_port (int or None): Serve the HTTP health endpoint on this
            port (0 picks a free one; see `Runner.health_address`):
            ``/livez``, ``/readyz`` and ``/statusz`` (`Runner.status` as
            JSON). It starts before ``main``, as the first service, so it
            stops last. A port in use fails the startup.
        health_host (str or None): The address the health endpoint listens
            on; None (the default) for every interface, as a kubelet probes
            the pod's IP address (see :doc:`deployment`).
        health_max_connections (int): Connections the health endpoint holds
            at once. At the limit, a new one closes the oldest connection
            still waiting for a request, so idle connections or a slowloris
            cannot keep probes out; a request head must be complete within
            2 s of its first byte.
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
        TypeError: for an argument of the wrong type, a ``main`` that is a
            synchronous function, or a ``clock`` that is not a
            `trio.abc.Clock`.
        ValueError: for a negative or NaN duration, a port outside
            0..65535, a ``health_host`` without a ``health_port``, a
            ``health_max_connections`` below 1, a signal
            that cannot be handled, a ``startup_timeout`` for a ``main`` without
            ``task_status``, or a ``second_signal`` other than ``"force"`` and
            ``"exit"``.
        RuntimeError: if signals are to be handled and this is not the main
            thread, or if called from inside a Trio run.
    """
    # The options are defined, with their defaults and checks, in RunOptions.
    settings = settle(
        main,
        RunOptions(
            grace=grace,
            unwind_budget=unwind_budget,
            startup_timeout=startup_timeout,
            signals=signals,
            exit_codes=exit_codes,
            clock=clock,
            name=name,
            second_signal=second_signal,
            drain_delay=drain_delay,
            stop_budget=stop_budget,
            health_port=health_port,
            health_host=health_host,
            health_max_connections=health_max_connections,
        ),
    )
    if settings.options.signals and (
        threading.current_thread() is not threading.main_thread()
    ):
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
    program = Program(main, tuple(args), settings, on_start=_set_current)
    return program.execute()


def _set_current(program: Program) -> None:
    _current.set(Runner._create(program))  # pyright: ignore[reportPrivateUsage]
