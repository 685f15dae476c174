"""`serve_workers`: N worker processes of one service behind shared sockets.

The pool's rules, and why:

* **The sockets stay open.** The supervisor holds the listening sockets
  for the whole run and passes them to each worker; a worker that stops
  closes its descriptor only, so connections wait in the shared queue for
  the other workers and none is refused.
* **Reload, one worker at a time, new worker first.** For each old worker: a
  new one starts (a fresh interpreter: new code, new configuration), and
  only once it is ready is the old one sent STOP, which it obeys by closing
  its listeners first and draining. A new worker that fails, or is not
  ready within ``ready_timeout``, is stopped, the old one goes on, and the
  reload is logged as failed. With one worker, there are two for a moment.
* **One change at a time.** Reloads, additions and removals are carried out
  in order, by one task. A reload asked for while one is queued already is
  folded into it (a burst of SIGHUP makes one reload after the current one).
* **Crashes are replaced at once,** outside that order. More than
  ``max_restarts`` unexpected ends within ``restart_window`` seconds (an
  OTP supervisor's restart intensity) stop the whole pool: every worker gets
  STOP, and `serve_workers` raises `WorkerCrashLoopError`, which
  `trio_graceful.run` turns into `ExitCodes.error` (1).
* **Readiness follows the workers.** `serve_workers` is ready once all of
  its first workers are. After that the program stays ready while at least
  one worker is (connections wait in the queue meanwhile, and withdrawing
  the last instance of a service from a load balancer would only refuse
  them); with fewer ready workers than asked for it is degraded
  (`Lifecycle.degrade`, which ``/statusz`` and systemd's status show), and
  it recovers when all are ready again.
"""

from __future__ import annotations

import collections
import enum
import math
import os
import signal
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Final, cast, final

import attrs
import trio

from .. import STOP, InboxReceiver, Lifecycle, LifecycleState, current_runner
from .._core._log import plural
from .._core._lowlevel import NoPublicConstructor
from .._deploy._sdnotify import SystemdNotifier, notifier_from_environment
from ._lifeline import open_lifeline
from ._sockets import FDS_VARIABLE, describe
from ._workerprocess import Worker, WorkerInfo, WorkerState, logger

DEFAULT_READY_TIMEOUT: Final = 30.0
DEFAULT_MAX_RESTARTS: Final = 5
DEFAULT_RESTART_WINDOW: Final = 10.0
SIGNALS: Final = (signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU)
PROGRESS_INTERVAL: Final = 5.0
"""Seconds between the log lines naming the workers still draining at a stop."""


class WorkerCrashLoopError(RuntimeError):
    """Workers ended unexpectedly more often than the restart intensity allows."""


@attrs.frozen
class WorkerPoolStatistics:
    """A snapshot of a `WorkerPool`."""

    target: int
    """How many workers the pool keeps (``workers``, changed by SIGTTIN and SIGTTOU)."""
    ready: int
    """How many of them are ready."""
    generation: int
    """How many reloads have begun."""
    reloading: bool
    """Whether a reload is under way."""
    workers: tuple[WorkerInfo, ...]
    """Every worker process that runs, by number."""

    def as_dict(self) -> dict[str, object]:
        """The snapshot as JSON-able values: what ``/statusz`` shows as ``workers``."""
        result = attrs.asdict(self, recurse=False)
        result["workers"] = [worker.as_dict() for worker in self.workers]
        return result


class _Change(enum.Enum):
    """What the signals ask for, carried out one at a time, in order."""

    RELOAD = "reload"
    ADD = "add a worker"
    REMOVE = "remove a worker"


@final
class WorkerPool(metaclass=NoPublicConstructor):
    """The workers of `serve_workers`: what it passes to ``task_status.started``.

    Its methods ask for what the signals ask for; none blocks, none is a
    checkpoint, and each change is carried out in order, as the module says.
    """

    def __init__(
        self,
        command: Sequence[str],
        options: Mapping[str, Any],
        *,
        target: int,
        ready_timeout: float,
        grace: float,
        intensity: tuple[int, float],
        notifier: SystemdNotifier,
        lifecycle: Lifecycle | None,
    ) -> None:
        self._command = tuple(command)
        self._options = options
        self._target = target
        self._ready_timeout = ready_timeout
        self._grace = grace
        self._max_restarts, self._window = intensity
        self._notifier = notifier
        self._lifecycle = lifecycle
        self._workers: dict[int, Worker] = {}
        self._numbers = 0
        self._generation = 0
        self._crashes: collections.deque[float] = collections.deque()
        self._changes_in, self._changes = trio.open_memory_channel[_Change](math.inf)
        self._reload_queued = False
        self._reloading = False
        self._ended = False
        self._failure: WorkerCrashLoopError | None = None
        self._changed = trio.Event()
        self._done = trio.Event()
        self._folder = ""
        self._lifeline = -1
        self._nursery: trio.Nursery | None = None

    # -- the public face ------------------------------------------------------

    def statistics(self) -> WorkerPoolStatistics:
        """Return a `WorkerPoolStatistics` snapshot. Not a checkpoint."""
        return WorkerPoolStatistics(
            self._target,
            self._count(WorkerState.READY),
            self._generation,
            self._reloading,
            tuple(worker.info() for worker in self._workers.values()),
        )

    def reload(self) -> None:
        """Replace every worker, one at a time, new worker first (as SIGHUP)."""
        if self._reload_queued:
            logger.info("a reload is queued already; this one is folded into it")
            return
        self._reload_queued = True
        self._changes_in.send_nowait(_Change.RELOAD)

    def add_worker(self) -> None:
        """Start one more worker (as SIGTTIN)."""
        self._changes_in.send_nowait(_Change.ADD)

    def remove_worker(self) -> None:
        """Stop one worker, which drains; never the last one (as SIGTTOU)."""
        self._changes_in.send_nowait(_Change.REMOVE)

    # -- running --------------------------------------------------------------

    def _members(self) -> list[Worker]:
        return [w for w in self._workers.values() if w.member and w.live]

    def _count(self, state: WorkerState) -> int:
        return sum(1 for worker in self._members() if worker.state is state)

    def _spawn(self, *, member: bool) -> Worker:
        assert self._nursery is not None
        self._numbers += 1
        worker = Worker(self._numbers, self._generation, member)
        self._workers[worker.number] = worker
        self._nursery.start_soon(
            self._run_worker, worker, name=f"worker {worker.number}"
        )
        return worker

    async def _run_worker(self, worker: Worker) -> None:
        try:
            await worker.run(
                self._command,
                options=self._options,
                folder=self._folder,
                lifeline=self._lifeline,
                ready_timeout=self._ready_timeout,
                grace=self._grace,
                on_change=self._on_change,
            )
        finally:
            del self._workers[worker.number]

    def _on_change(self, worker: Worker) -> None:
        if worker.state is WorkerState.EXITED and worker.member and not worker.retired:
            self._crashed(worker)
        self._follow_readiness()
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def _crashed(self, worker: Worker) -> None:
        if self._ended or self._failure is not None:
            return  # the pool is stopping: nothing is replaced
        now = time.monotonic()
        self._crashes.append(now)
        while self._crashes[0] < now - self._window:
            self._crashes.popleft()
        if len(self._crashes) > self._max_restarts:
            times = plural(len(self._crashes), "time")
            message = (
                f"workers ended unexpectedly {times} within "
                f"{self._window:g} s (at most {self._max_restarts} allowed); the "
                f"last was {worker.name()}, which {_ending(worker)}"
            )
            logger.error("%s; stopping the service", message)
            self._failure = WorkerCrashLoopError(message)
            self._finish()
            return
        logger.warning(
            "%s ended unexpectedly: it %s; replacing it", worker.name(), _ending(worker)
        )
        if len(self._members()) < self._target:
            self._spawn(member=True)

    def _follow_readiness(self) -> None:
        lifecycle = self._lifecycle
        if lifecycle is None or self._ended:
            return
        ready = self._count(WorkerState.READY)
        if ready < self._target and lifecycle.ready:
            reason = f"{ready} of {plural(self._target, 'worker')} ready"
            if lifecycle.reason != reason:
                lifecycle.degrade(reason)
        elif ready >= self._target and lifecycle.state is LifecycleState.DEGRADED:
            lifecycle.recover(f"{plural(self._target, 'worker')} ready")

    async def _wait_changed(self) -> None:
        await self._changed.wait()

    def _finish(self) -> None:
        self._done.set()
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    async def serve(
        self,
        inbox: InboxReceiver[Any],
        signals: AsyncIterator[int] | None,
        task_status: trio.TaskStatus[WorkerPool],
    ) -> None:
        """Start the workers, carry out the changes until STOP, stop them."""
        with (
            tempfile.TemporaryDirectory(prefix="trio-graceful-workers-") as folder,
            open_lifeline() as lifeline,
        ):
            self._folder = folder
            self._lifeline = lifeline
            async with trio.open_nursery() as processes:
                self._nursery = processes
                async with trio.open_nursery() as control:
                    control.start_soon(self._wait_stop, inbox)
                    for _ in range(self._target):
                        self._spawn(member=True)
                    while not self._done.is_set() and (
                        self._count(WorkerState.READY) < self._target
                    ):
                        await self._wait_changed()
                    if not self._done.is_set():
                        task_status.started(self)
                        if signals is not None:
                            control.start_soon(self._take_signals, signals)
                        control.start_soon(self._carry_out_changes)
                        await self._done.wait()
                    control.cancel_scope.cancel()
                await self._stop_all()
        if self._failure is not None:
            raise self._failure

    async def _carry_out_changes(self) -> None:
        async for change in self._changes:
            if change is _Change.RELOAD:
                self._reload_queued = False
                self._reloading = True
                try:
                    await self._reload()
                finally:
                    self._reloading = False
            elif change is _Change.ADD:
                await self._add()
            elif self._target == 1:
                logger.warning("not removing the last worker")
            else:
                self._target -= 1
                logger.info("removing a worker: %s now", plural(self._target, "worker"))
                await self._retire(self._members()[0], "removed")
                self._follow_readiness()

    async def _reload(self) -> None:
        self._generation += 1
        generation = self._generation
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self._notifier.notify(RELOADING="1", MONOTONIC_USEC=str(usec))
        old = [worker for worker in self._members() if worker.generation < generation]
        logger.info(
            "reload %d started: replacing %s, one at a time",
            generation,
            plural(len(old), "worker"),
        )
        failure = ""
        for worker in old:
            if not worker.live:
                continue  # ended meanwhile; its replacement is of this generation
            new = self._spawn(member=False)
            failure = await self._admit(new)
            if failure:
                break
            await self._retire(worker, f"replaced by worker {new.number}")
        if failure:
            logger.error(
                "reload %d failed: %s; the old workers go on serving",
                generation,
                failure,
            )
            self._notifier.ready(status=f"reload {generation} failed: {failure}")
        else:
            logger.info("reload %d done", generation)
            self._notifier.ready(status=f"reload {generation} done")

    async def _add(self) -> None:
        new = self._spawn(member=False)
        failure = await self._admit(new)
        if failure:
            logger.error("adding a worker failed: %s", failure)
        else:
            self._target += 1
            logger.info(
                "added worker %d: %s now", new.number, plural(self._target, "worker")
            )

    async def _admit(self, new: Worker) -> str:
        """Wait until ``new`` is ready, and count it; return "" or what failed.

        A worker that is not ready in time, or ends first, is stopped and
        not counted: what it did is returned, for the log.
        """
        while new.state is WorkerState.STARTING:
            await self._wait_changed()
        if new.state is WorkerState.READY:
            new.member = True
            return ""
        await self._retire(new, "not admitted")
        return f"{new.name()} {_ending(new)}"

    async def _retire(self, worker: Worker, why: str) -> None:
        worker.retired = True
        worker.request_stop(self._grace, why)
        await worker.exited.wait()

    async def _stop_all(self) -> None:
        self._ended = True
        draining = list(self._workers.values())
        for worker in draining:
            worker.retired = True
            worker.request_stop(math.inf, "the service stops")
        while draining:
            with trio.move_on_after(PROGRESS_INTERVAL):
                for worker in draining:
                    await worker.exited.wait()
            draining = [worker for worker in draining if not worker.exited.is_set()]
            if draining:
                names = ", ".join(worker.name() for worker in draining)
                logger.info("still draining: %s", names)

    async def _take_signals(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            logger.info("got %s", signal.Signals(signum).name)
            if signum == signal.SIGHUP:
                self.reload()
            elif signum == signal.SIGTTIN:
                self.add_worker()
            else:
                self.remove_worker()

    async def _wait_stop(self, inbox: InboxReceiver[Any]) -> None:
        while await inbox.receive() is not STOP:
            pass
        self._finish()


def _ending(worker: Worker) -> str:
    """How a worker ended, for the log: what failed, or its end and last status.

    A worker stopped for a fault (not ready in time) reports the fault: its
    last status is then its own shutdown's.
    """
    if worker.fault:
        return worker.fault
    status = f"; its last status: {worker.status}" if worker.status else ""
    return f"{worker.describe_end()}{status}"


async def serve_workers(
    inbox: InboxReceiver[Any],
    command: Sequence[str],
    *,
    sockets: Sequence[socket.socket],
    workers: int = 1,
    ready_timeout: float = DEFAULT_READY_TIMEOUT,
    grace: float | None = None,
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    restart_window: float = DEFAULT_RESTART_WINDOW,
    env: Mapping[str, str] | None = None,
    notify_socket: str | None = None,
    handle_signals: bool = True,
    task_status: trio.TaskStatus[WorkerPool] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``workers`` processes of ``command`` that serve ``sockets``, until STOP.

    Run it as a service of `trio_graceful.run`::

        pool = await runner.start_service(
            functools.partial(serve_workers, sockets=open_listeners(["0.0.0.0:8000"])),
            [sys.executable, "-m", "myservice.worker"],
        )

    Each worker is started with the sockets as inherited descriptors, named
    in ``$TRIO_GRACEFUL_WORKER_FDS`` (a worker finds them with
    `inherited_sockets` or `inherited_binds`), and with ``$NOTIFY_SOCKET``
    naming a socket where it says ``READY=1`` once it accepts: a
    `trio_graceful.run` program does so when ``main`` is ready. It is a
    `trio_graceful.run_process` child of a bundle of its own, in a process
    group of its own: STOP is SIGTERM, the hard cancel SIGKILL. `serve_workers`
    is ready (``task_status.started``, with the `WorkerPool`) once every
    first worker is ready. Under `trio_graceful.run`, ``/statusz`` lists the
    workers as ``workers`` (`WorkerPoolStatistics.as_dict`): each one's pid,
    generation, state and the requests it runs, as it last said in
    ``X_REQUESTS_IN_FLIGHT=N`` (the workers of ``python -m
    trio_graceful.asgi`` do).

    SIGHUP reloads (every worker replaced by a new one, one at a time, new
    worker first, each gated on its readiness), SIGTTIN adds a worker,
    SIGTTOU removes one; a worker that ends unexpectedly is replaced at once.
    :doc:`workers` states the rules; the log
    (``trio_graceful.workers``) has a line for each worker's start, readiness,
    stop and end, with its number, process id and generation.

    At STOP every worker gets STOP at once, also while the first workers
    are still starting, and `serve_workers` returns when all have ended.
    They drain within the hard deadline of the calling task (the runner's
    grace, after its drain delay): at that deadline, the workers still
    running get SIGKILL. This is a checkpoint.

    Args:
        inbox (InboxReceiver): Where STOP arrives (a runner's service gets one).
        command (list of str): The worker's command line.
        sockets (list of socket.socket): Listening sockets, from
            `open_listeners` or `systemd_listeners`; they stay the caller's.
        workers (int): How many workers to run.
        ready_timeout (float): Seconds a worker has to become ready; then
            it is stopped (as a crash, or as a failed reload).
        grace (float or None): Seconds a worker stopped by a reload or by
            SIGTTOU has to drain before SIGKILL; None for the runner's grace
            (10 s outside a runner).
        max_restarts (int): Unexpected ends allowed within ``restart_window``
            seconds; one more stops the pool with `WorkerCrashLoopError`.
        restart_window (float): See ``max_restarts``.
        env (dict of str or None): The workers' environment; None for this
            process's.
        notify_socket (str or None): The service manager's
            ``$NOTIFY_SOCKET``, for systemd's ``Type=notify-reload``: a reload
            sends ``RELOADING=1`` with ``MONOTONIC_USEC=`` there, and
            ``READY=1`` when it is over. `trio_graceful.run` removes the
            variable from the environment as it starts, so read it before.
        handle_signals (bool): Take SIGHUP, SIGTTIN and SIGTTOU (only from
            the main thread); with False, use the `WorkerPool`'s methods.
        task_status: Trio's; gets the `WorkerPool`.

    Raises:
        ValueError: if a count is less than 1 (``max_restarts`` less than
            0), a duration negative or NaN, ``command`` or ``sockets`` empty.
        WorkerCrashLoopError: if workers ended unexpectedly more than
            ``max_restarts`` times within ``restart_window`` seconds; the
            other workers were stopped first.
    """
    _check(
        command, sockets, workers, ready_timeout, grace, max_restarts, restart_window
    )
    try:
        runner = current_runner()
    except RuntimeError:
        runner = None
    fds = [sock.fileno() for sock in sockets]
    environment = {**(os.environ if env is None else env)}
    environment[FDS_VARIABLE] = ",".join(map(str, fds))
    options: dict[str, Any] = {"env": environment, "pass_fds": fds, "stdin": None}
    notifier = notifier_from_environment(
        {"NOTIFY_SOCKET": notify_socket or ""}, unset_environment=False
    )
    if grace is None:
        grace = 10.0 if runner is None else runner.grace
    pool = WorkerPool._create(  # pyright: ignore[reportPrivateUsage]
        command,
        options,
        target=workers,
        ready_timeout=ready_timeout,
        grace=grace,
        intensity=(max_restarts, restart_window),
        notifier=notifier,
        lifecycle=None if runner is None else runner.lifecycle,
    )
    for sock in sockets:
        logger.info("listening on %s for %s", describe(sock), plural(workers, "worker"))
    receiver: AbstractContextManager[AsyncIterator[int] | None] = (
        trio.open_signal_receiver(*SIGNALS) if handle_signals else nullcontext()
    )
    listed: AbstractContextManager[None] = (
        nullcontext()
        if runner is None
        else runner.status_detail("workers", lambda: pool.statistics().as_dict())
    )
    with receiver as signals, listed:
        await pool.serve(inbox, signals, task_status)


def _check(
    command: Sequence[str],
    sockets: Sequence[socket.socket],
    workers: int,
    ready_timeout: float,
    grace: float | None,
    max_restarts: int,
    restart_window: float,
) -> None:
    if isinstance(command, str) or not command:
        raise ValueError(
            f"command must be a non-empty list of strings, not {command!r}"
        )
    if not sockets:
        raise ValueError("sockets must hold at least one listening socket")
    counts = (("workers", workers, 1), ("max_restarts", max_restarts, 0))
    for name, count, least in counts:
        if isinstance(count, bool) or not isinstance(cast("object", count), int):
            raise TypeError(f"{name} must be an int, not {count!r}")
        if count < least:
            raise ValueError(f"{name} must be >= {least}, not {count}")
    for name, seconds in (
        ("ready_timeout", ready_timeout),
        ("grace", grace),
        ("restart_window", restart_window),
    ):
        if seconds is None:
            continue
        if isinstance(seconds, bool) or not isinstance(
            cast("object", seconds), (int, float)
        ):
            raise TypeError(f"{name} must be a number of seconds, not {seconds!r}")
        if not seconds >= 0:
            raise ValueError(f"{name} must be >= 0, not {seconds!r}")
