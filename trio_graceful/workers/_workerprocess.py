"""One worker process: started, ready, stopping, exited, as one table says.

A worker is a `trio_graceful.run_process` child of a bundle of its own, so
it gets the bundle's rules: a process group of its own, STOP as SIGTERM,
SIGKILL at the hard cancel. Stopping one worker is ``shutdown(grace)`` on
its bundle; the others go on.

It tells the supervisor how it is in sd_notify(3)'s words: each worker gets
``$NOTIFY_SOCKET`` naming a datagram socket of its own, in a folder only the
supervisor's user can enter, and ``READY=1`` there makes it ready. A program
run by `trio_graceful.run` sends that by itself once ``main`` is ready (and
``STATUS=`` lines as its state changes, ``STOPPING=1`` at its shutdown); any
program that speaks the protocol (libsystemd's ``sd_notify``) will do too.
The last ``STATUS=`` a worker sent is kept, for the log line that tells of
its end, and so is the last ``X_REQUESTS_IN_FLIGHT=N`` (a field of our own:
systemd ignores those that begin with ``X_``), for ``/statusz``.
"""

from __future__ import annotations

import enum
import functools
import math
import os
import signal
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, final

import attrs
import trio

from .. import open_bundle, run_process
from .._core._log import library_logger
from .._core._statetable import StateTable

logger = library_logger("trio_graceful.workers")

IN_FLIGHT_FIELD: Final = "X_REQUESTS_IN_FLIGHT"
"""The notification field in which a worker tells how many requests it runs."""
GENERATION_VARIABLE: Final = "TRIO_GRACEFUL_WORKER_GENERATION"
NUMBER_VARIABLE: Final = "TRIO_GRACEFUL_WORKER"
LIFELINE_VARIABLE: Final = "TRIO_GRACEFUL_WORKER_LIFELINE"
"""The variable naming the descriptor of a worker's end of the lifeline
(`trio_graceful.workers.watch_supervisor`)."""


class WorkerState(enum.Enum):
    """Where a worker process is in its life."""

    STARTING = "starting"
    """Running, and not ready yet: it has not sent ``READY=1``."""
    READY = "ready"
    """Said ``READY=1``: it accepts connections."""
    STOPPING = "stopping"
    """Sent STOP (SIGTERM): it has stopped accepting and drains."""
    EXITED = "exited"
    """The process has ended."""


class _Event(enum.Enum):
    BECOME_READY = "become ready"
    STOP = "stop"
    EXIT = "exit"


TRANSITIONS: Final[Mapping[tuple[WorkerState, _Event], WorkerState]] = {
    (WorkerState.STARTING, _Event.BECOME_READY): WorkerState.READY,
    (WorkerState.READY, _Event.BECOME_READY): WorkerState.READY,
    # A READY=1 sent as STOP came is too late to count.
    (WorkerState.STOPPING, _Event.BECOME_READY): WorkerState.STOPPING,
    (WorkerState.STARTING, _Event.STOP): WorkerState.STOPPING,
    (WorkerState.READY, _Event.STOP): WorkerState.STOPPING,
    (WorkerState.STOPPING, _Event.STOP): WorkerState.STOPPING,
    (WorkerState.STARTING, _Event.EXIT): WorkerState.EXITED,
    (WorkerState.READY, _Event.EXIT): WorkerState.EXITED,
    (WorkerState.STOPPING, _Event.EXIT): WorkerState.EXITED,
}
"""``(state, event) -> state``: the only moves a worker makes."""

_TABLE: Final = StateTable(TRANSITIONS, WorkerState)
_LIVE: Final = frozenset({WorkerState.STARTING, WorkerState.READY})


@attrs.frozen
class WorkerInfo:
    """One worker process, as `WorkerPool.statistics` saw it."""

    number: int
    """The worker's number, counted from 1 over the life of the pool."""
    generation: int
    """How many reloads had begun when the worker was started."""
    pid: int | None
    """Its process id; None until the process has been started."""
    state: WorkerState
    """Where it is in its life."""
    status: str
    """The last ``STATUS=`` it sent, or ``""``."""
    requests_in_flight: int | None = None
    """The requests it runs, as it last said (``X_REQUESTS_IN_FLIGHT=N``);
    None if it never said."""

    def as_dict(self) -> dict[str, object]:
        """The worker as JSON-able values, its state as its string value."""
        result = attrs.asdict(self, recurse=False)
        result["state"] = self.state.value
        return result


@final
@attrs.define(eq=False)
class Worker:
    """One worker process and its state; the supervisor's record of it."""

    number: int
    generation: int
    # Whether the pool counts it: False for the new worker of a reload until
    # it is ready, whose failure fails the reload and is not a crash.
    member: bool
    state: WorkerState = attrs.field(default=WorkerState.STARTING, init=False)
    pid: int | None = attrs.field(default=None, init=False)
    returncode: int | None = attrs.field(default=None, init=False)
    status: str = attrs.field(default="", init=False)
    requests_in_flight: int | None = attrs.field(default=None, init=False)
    # Set when the supervisor itself stops it (reload, scale, shutdown): its
    # end is then no crash.
    retired: bool = attrs.field(default=False, init=False)
    # What went wrong before it was ready ("was not ready within 3 s").
    fault: str = attrs.field(default="", init=False)
    exited: trio.Event = attrs.field(factory=trio.Event, init=False)
    # Set, and replaced by a fresh one, at every change the worker's own
    # tasks wait for: a stop asked for, readiness, the process's end.
    _changed: trio.Event = attrs.field(factory=trio.Event, init=False)
    _process_ended: bool = attrs.field(default=False, init=False)
    _process_handle: trio.Process | None = attrs.field(default=None, init=False)
    _stop_grace: float = attrs.field(default=math.inf, init=False)

    @property
    def live(self) -> bool:
        """Whether it runs and has not been told to stop."""
        return self.state in _LIVE

    def name(self) -> str:
        pid = "not started" if self.pid is None else f"pid {self.pid}"
        return f"worker {self.number} ({pid}, generation {self.generation})"

    def info(self) -> WorkerInfo:
        return WorkerInfo(
            self.number,
            self.generation,
            self.pid,
            self.state,
            self.status,
            self.requests_in_flight,
        )

    def describe_end(self) -> str:
        code = self.returncode
        if code is None:
            return self.fault or "could not be started"
        if code < 0:
            try:
                return f"was ended by {signal.Signals(-code).name}"
            except ValueError:  # pragma: no cover - not a signal Python knows
                return f"was ended by signal {-code}"
        return f"exited with status {code}"

    def request_stop(self, grace: float, why: str) -> None:
        """Send STOP (SIGTERM); SIGKILL ``grace`` seconds later. Not a checkpoint."""
        if self.state is WorkerState.EXITED:
            return
        first = self.state is not WorkerState.STOPPING
        self._move(_Event.STOP)
        self._stop_grace = min(self._stop_grace, grace)
        if first:
            logger.info("%s stopping (%s)", self.name(), why)
        self._poke()

    def _poke(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def _move(self, event: _Event) -> None:
        self.state = _TABLE.move(self.state, event, subject=f"worker {self.number}")

    async def run(
        self,
        command: Sequence[str],
        *,
        options: Mapping[str, Any],
        folder: str,
        lifeline: int,
        ready_timeout: float,
        grace: float,
        on_change: Callable[[Worker], None],
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run the process until it ends; call ``on_change`` at each move.

        ``options`` are `trio_graceful.run_process`'s; its ``env`` gets
        ``$NOTIFY_SOCKET``, the worker's number and generation, and the
        descriptor ``lifeline`` (the read end of the supervisor's lifeline,
        passed to the process with the sockets). Started
        (``task_status``) once the process runs, or has failed to start.
        """
        path = os.path.join(folder, f"notify-{self.number}")
        notifications = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notifications.setblocking(False)
        env = {
            **options.get("env", os.environ),
            "NOTIFY_SOCKET": path,
            NUMBER_VARIABLE: str(self.number),
            GENERATION_VARIABLE: str(self.generation),
            LIFELINE_VARIABLE: str(lifeline),
        }
        pass_fds = [*options.get("pass_fds", ()), lifeline]
        with notifications:
            notifications.bind(path)
            try:
                async with trio.open_nursery() as helpers:
                    helpers.start_soon(self._listen, notifications, on_change)
                    try:
                        await self._run_process(
                            command,
                            {**options, "env": env, "pass_fds": pass_fds},
                            (ready_timeout, grace),
                            helpers,
                            task_status,
                        )
                    finally:
                        helpers.cancel_scope.cancel()
            except BaseException:
                # Hard-cancelled (the process got SIGKILL): no crash of its own.
                self.retired = True
                raise
            finally:
                # What it said just before it ended counts too (its last status).
                self._read_notifications(notifications, on_change)
                self._end(on_change)

    def _end(self, on_change: Callable[[Worker], None]) -> None:
        process = self._process_handle
        if process is not None:
            self.returncode = process.returncode
        if self.state is not WorkerState.EXITED:
            self._move(_Event.EXIT)
        logger.info("%s %s", self.name(), self.describe_end())
        self.exited.set()
        on_change(self)

    async def _run_process(
        self,
        command: Sequence[str],
        options: Mapping[str, Any],
        ready: tuple[float, float],
        helpers: trio.Nursery,
        task_status: trio.TaskStatus[None],
    ) -> None:
        async with open_bundle(name=f"worker {self.number}") as own:
            try:
                process: trio.Process = await own.start(
                    functools.partial(self._process, command, options)
                )
            except OSError as exc:
                self.fault = f"could not be started: {exc}"
                logger.error("worker %d %s", self.number, self.fault)
                task_status.started()
                return
            self.pid = process.pid
            self._process_handle = process
            logger.info("%s started", self.name())
            helpers.start_soon(self._ready_deadline, *ready)
            task_status.started()
            while not self._process_ended and self.state is not WorkerState.STOPPING:
                await self._changed.wait()
            if not self._process_ended:
                await own.shutdown(self._stop_grace)

    async def _process(
        self,
        command: Sequence[str],
        options: Mapping[str, Any],
        *,
        task_status: trio.TaskStatus[trio.Process],
    ) -> None:
        try:
            await run_process(command, check=False, task_status=task_status, **options)
        finally:
            self._process_ended = True
            self._poke()

    async def _ready_deadline(self, timeout: float, grace: float) -> None:
        with trio.move_on_after(timeout):
            while self.state is WorkerState.STARTING and not self._process_ended:
                await self._changed.wait()
        if self.state is WorkerState.STARTING and not self._process_ended:
            self.fault = f"was not ready within {timeout:g} s"
            logger.warning("%s %s", self.name(), self.fault)
            self.request_stop(grace, "not ready")

    async def _listen(
        self, sock: socket.socket, on_change: Callable[[Worker], None]
    ) -> None:
        while True:
            await trio.lowlevel.wait_readable(sock)
            self._read_notifications(sock, on_change)

    def _read_notifications(
        self, sock: socket.socket, on_change: Callable[[Worker], None]
    ) -> None:
        while True:
            try:
                datagram = sock.recv(4096)
            except BlockingIOError:
                return
            fields: dict[str, str] = {}
            for line in datagram.decode(errors="replace").splitlines():
                key, _, value = line.partition("=")
                fields[key] = value
            if "STATUS" in fields:
                self.status = fields["STATUS"]
            if fields.get(IN_FLIGHT_FIELD, "").isdigit():
                self.requests_in_flight = int(fields[IN_FLIGHT_FIELD])
            if fields.get("READY") == "1" and self.state is not WorkerState.EXITED:
                before = self.state
                self._move(_Event.BECOME_READY)
                if before is WorkerState.STARTING:
                    logger.info("%s ready", self.name())
                    self._poke()
                    on_change(self)
