"""The exit after a run that took a signal: within the stop time, or at the next signal.

A signal tells the process to stop, and the process must then end within its
stop time, however its threads behave: drain delay + grace + unwind budget
after the first signal, and the second the watchdog allows a thread that is
still busy (a run may return that late); with the report's second, the
whole `StopTimes.total` that the stop budget checks. `run` returning is not
the end of the process: the interpreter then waits for every thread that is
not a daemon (``threading._shutdown``) and runs the ``atexit`` functions,
and a library's file watcher, or an executor's worker stuck in a task, keeps
it waiting forever. `ExitGuard` bounds that exit, from the moment `run`
returns:

* until the stop time is over, the process is on its way out, and the next
  shutdown signal ends it at once, with ``128 + n``;
* if the interpreter's exit begins before the stop time is over, the stop
  time bounds it: when it is over, the threads still running are named in
  the log, with their stacks, and the process ends with the status `run`
  returned;
* a program that goes on past the stop time is a program like any other:
  the guard stands down, and at the next signal the handlers the process had
  before the run come back and take it. So a program that goes on (a test
  that calls `run` in its own process, a batch that calls it in a loop) is
  never ended by the guard while it runs.

How (``STATES`` is the table of what may follow what):

* The handlers. As a run that took a signal returns, its relay hands its
  signals to `ExitGuard.arm`, which installs the guard's handler for them:
  it passes each signal to the guard's thread through a pipe. The previous
  handlers cannot simply come back then: a signal between `run` returning
  and the interpreter's exit would kill the process by SIGTERM's default
  action, or raise `KeyboardInterrupt` in whatever runs, against the status
  the log gives (see ``_signals._relay``).
* The exit's start: a function that ``threading._register_atexit`` keeps
  (Python 3.9 and later), which ``threading._shutdown`` calls in the main
  thread before it waits for the threads that are not daemons. It makes the
  pipe the signal wakeup fd: CPython's C-level handler writes to it whatever
  the main thread does (3.13 waits for the threads in C, and runs no
  Python-level handler meanwhile). Such functions run in the reverse order
  of their registration, so one registered after `run` returned (a
  `concurrent.futures.ThreadPoolExecutor` first used then) runs before it.
* The end: an ``atexit`` function, registered when the guard is first armed
  (so it runs after the ``atexit`` functions registered since), makes the
  signals ignored (the interpreter's finalization gives every Python-level
  handler back to ``SIG_DFL``, and only ``SIG_IGN`` survives it) and closes
  the guard, so that the process exits with the status of its exit and not
  one the guard chose an instant too late.
* The report is written by a thread started in advance (Python 3.12 refuses
  to start a thread during the interpreter's exit) and gets at most
  `REPORT_TIMEOUT` seconds; then ``os._exit`` runs regardless.

Process-wide by nature: signal handlers, the interpreter's exit and the
process's end belong to the process, not to a run. So there is one guard
(`exit_guard`), and it keeps only what the exit needs: the status and the
stop time of the last run that took a signal, and the handlers from before
the first one.
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import logging
import math
import os
import queue
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import FrameType, MappingProxyType
from typing import Any, Final, final

from ..._core._log import library_logger
from ..._core._lowlevel import signal_name
from ..._core._statetable import StateTable
from .._shutdown._stoptime import REPORT_TIMEOUT
from .._signals._relay import blocked
from ._tasktree import format_thread_stacks

logger = library_logger("trio_graceful.runner")

# Signal numbers are never 0, so a 0 byte on the pipe only wakes the thread.
_WAKE: Final = 0

# The longest single wait; a far deadline is waited for in steps.
_LONGEST: Final = 86_400.0


class GuardState(enum.Enum):
    """Where the exit after the last signal-taking run is."""

    IDLE = "idle"
    """No run has taken a signal, or the guard stood down."""
    ARMED = "armed"
    """`run` returned within the stop time; the program runs on."""
    EXITING = "exiting"
    """The interpreter's exit began within the stop time."""
    ENDING = "ending"
    """The guard is ending the process (a signal, or the stop time ran out)."""
    CLOSED = "closed"
    """The last ``atexit`` step ran: the exit finishes as Python's own."""


class Move(enum.Enum):
    """What happens to the guard."""

    ARM = "arm"
    EXIT_BEGINS = "exit begins"
    STOP_TIME_OVER = "stop time over"
    SIGNAL = "signal"
    LAST_STEP = "last step"
    STAND_DOWN = "stand down"


_S, _M = GuardState, Move
STATES: Final[Mapping[tuple[GuardState, Move], GuardState]] = MappingProxyType(
    {
        (_S.IDLE, _M.ARM): _S.ARMED,
        (_S.ARMED, _M.ARM): _S.ARMED,
        (_S.ARMED, _M.EXIT_BEGINS): _S.EXITING,
        (_S.ARMED, _M.STOP_TIME_OVER): _S.IDLE,
        (_S.ARMED, _M.SIGNAL): _S.ENDING,
        (_S.ARMED, _M.LAST_STEP): _S.CLOSED,
        (_S.EXITING, _M.STOP_TIME_OVER): _S.ENDING,
        (_S.EXITING, _M.SIGNAL): _S.ENDING,
        (_S.EXITING, _M.LAST_STEP): _S.CLOSED,
        **{(state, _M.STAND_DOWN): _S.IDLE for state in GuardState},
    }
)
"""What follows what; a move the table does not list changes nothing."""

TABLE: Final = StateTable(STATES, GuardState)
"""The questions asked of `STATES`."""


@final
class ExitGuard:
    """Bounds the process's exit after a run that took a signal (see the module).

    Args:
        end: Ends the process with a status; `os._exit` but in tests.
    """

    def __init__(self, end: Callable[[int], object] = os._exit) -> None:
        self._end = end
        self._lock = threading.Lock()
        self.state = GuardState.IDLE
        """The guard's state; read it anywhere, change it through `_move`."""
        self._deadline = math.inf  # time.monotonic()
        self._stop_time = ""  # how the deadline came to be, for the log
        self._status = 0
        self._late_status: Callable[[int], int] = lambda signum: 128 + signum
        self._internals = False
        self._previous: dict[int, Any] = {}
        self._handler = self._handle  # one object, to tell whether it is installed
        self._read_fd = self._write_fd = -1
        self._reports: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    # -- the run's side (main thread) -------------------------------------------

    def arm(
        self,
        previous: Mapping[int, Any],
        late: Iterable[int],
        *,
        status: int,
        late_status: Callable[[int], int],
        deadline: float,
        stop_time: str,
        internals: bool = False,
    ) -> None:
        """Take over the signals of a run that took one, as it returns.

        Call it in the main thread with ``previous`` blocked.

        Args:
            previous: The handlers the run found, by signal.
            late: Signals the run kept without acting on them: each ends
                the process at once.
            status: The status `run` returns.
            late_status: The status after a late signal.
            deadline: The end of the stop time, in `time.monotonic` time.
            stop_time: How far the deadline is from the first signal, for
                the log (``14 s after SIGTERM``).
            internals: Whether stacks show the frames of trio and trio_graceful.
        """
        # Blocked: the guard's handler takes the lock.
        with blocked(self._previous.keys() | previous.keys()), self._lock:
            self._start()
            for signum, handler in previous.items():
                if handler is not self._handler:
                    self._previous[signum] = handler
                signal.signal(signum, self._handler)
            self._status, self._late_status = status, late_status
            self._deadline, self._stop_time = deadline, stop_time
            self._internals = internals
            self._move(Move.ARM)
        for signum in late:
            self._send(signum)
        self._send(_WAKE)

    def stand_down(self) -> None:
        """Stop guarding: the program goes on (as after its stop time)."""
        with blocked(self._previous), self._lock:
            self._move(Move.STAND_DOWN)
        self._send(_WAKE)

    def _start(self) -> None:
        if self._threads:
            return
        self._read_fd, self._write_fd = os.pipe()
        for fd in (self._read_fd, self._write_fd):
            os.set_blocking(fd, False)  # a wakeup fd must be; reads wait in select
        self._threads = [
            threading.Thread(target=self._watch, name="trio_graceful exit guard"),
            threading.Thread(target=self._report, name="trio_graceful exit report"),
        ]
        # The threads never take a signal: they inherit the mask.
        with blocked(signal.valid_signals()):
            for thread in self._threads:
                thread.daemon = True
                thread.start()
        with contextlib.suppress(RuntimeError):  # the exit has begun already
            threading._register_atexit(self._exit_begins)  # type: ignore[attr-defined] # pyright: ignore
        atexit.register(self._last_step)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # In the main thread, between two bytecodes of whatever it runs, and
        # never waiting: the guard's thread holds the lock while it ends the
        # process, and each signal of a storm would nest one more wait for it
        # here. Where this thread holds the lock, it blocks the signals.
        if not self._lock.acquire(blocking=False):
            self._send(signum)  # the thread decides, once it has the lock
            return
        try:
            idle = self._check_time() is GuardState.IDLE
        finally:
            self._lock.release()
        if idle:
            self._give_back(signum, frame)
        else:
            self._send(signum)

    def _give_back(self, signum: int, frame: FrameType | None) -> None:
        """Put the previous handlers back, and let the previous one take ``signum``."""
        with blocked(self._previous):
            for other, handler in self._previous.items():
                if signal.getsignal(other) is self._handler:
                    signal.signal(other, handler)
        handler = self._previous.get(signum, signal.SIG_DFL)
        if callable(handler):
            handler(signum, frame)
        elif handler in (signal.SIG_DFL, None):
            signal.raise_signal(signum)  # its default action, now
        # SIG_IGN: ignored, as it was before the run.

    def _exit_begins(self) -> None:
        # threading._shutdown, in the main thread, before it waits for threads.
        try:
            with blocked(self._previous), self._lock:
                if self._check_time() is not GuardState.ARMED:
                    return
                signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
                self._move(Move.EXIT_BEGINS)
            self._send(_WAKE)
        except Exception as exc:  # an exception here would skip the others
            logger.error("the exit guard failed: %r", exc)

    def _last_step(self) -> None:
        # The last atexit function that is ours; the finalization follows.
        with blocked(self._previous), self._lock:
            # A signal already on its way to the thread ends the process
            # now; after this step the guard does nothing.
            signals = [b for b in self._read_pipe() if b != _WAKE]
            if signals:
                self._on_signal(signals[0])
            if self._move(Move.LAST_STEP) is GuardState.CLOSED:
                for signum in self._previous:
                    if signal.getsignal(signum) is self._handler:
                        signal.signal(signum, signal.SIG_IGN)

    # -- the guard's thread ----------------------------------------------------------

    def _watch(self) -> None:
        while True:
            timeout: float | None = None
            if self.state in (GuardState.ARMED, GuardState.EXITING):
                # select() refuses timeouts beyond the platform's time_t.
                left = self._deadline - time.monotonic()
                timeout = None if left == math.inf else min(max(0.0, left), _LONGEST)
            readable, _, _ = select.select([self._read_fd], [], [], timeout)
            with self._lock:
                if readable:
                    signals = [b for b in self._read_pipe() if b != _WAKE]
                    if signals:
                        self._on_signal(signals[0])
                elif time.monotonic() >= self._deadline:
                    self._on_stop_time_over()

    def _on_signal(self, signum: int) -> None:
        state = self._check_time()
        if state in (GuardState.ARMED, GuardState.EXITING):
            self._end_at_once(signum)
        elif state is GuardState.IDLE:
            # The handler passed it on as the stop time ended: send it
            # again, for the handler to give to the previous one.
            os.kill(os.getpid(), signum)

    def _on_stop_time_over(self) -> None:
        state = self._move(Move.STOP_TIME_OVER)
        if state is not GuardState.ENDING:
            return
        internals = self._internals
        names = _threads_keeping_the_exit()

        def report() -> None:
            logger.critical(
                "exit cut short: still exiting %s; threads still running: %s",
                self._stop_time,
                names or "none but the main thread",
            )
            ours = {t.ident for t in self._threads if t.ident is not None}
            text = format_thread_stacks(skip=ours, internals=internals)
            _write_all(2, text.encode(errors="backslashreplace"))

        self._finish(report, self._status)

    def _end_at_once(self, signum: int) -> None:
        exiting = self.state is GuardState.EXITING
        self._move(Move.SIGNAL)
        # Once the exit has begun, the threads it waits for are news.
        names = _threads_keeping_the_exit() if exiting else ""
        threads = f"; threads still running: {names}" if names else ""

        def report() -> None:
            logger.warning(
                "exiting at once: %s after the run%s", signal_name(signum), threads
            )

        self._finish(report, self._late_status(signum))

    def _finish(self, report: Callable[[], None], status: int) -> None:
        """Write ``report`` within `REPORT_TIMEOUT`, then end with ``status``."""
        done = threading.Event()

        def write() -> None:
            try:
                report()
                _flush_output()
            except Exception as exc:
                with contextlib.suppress(OSError):
                    _write_all(2, f"exit report failed: {exc!r}\n".encode())
            finally:
                done.set()

        self._reports.put(write)
        done.wait(REPORT_TIMEOUT)
        self._end(status)

    def _report(self) -> None:
        while True:
            self._reports.get()()

    # -- helpers ---------------------------------------------------------------------

    def _check_time(self) -> GuardState:
        """Stand down if the program runs on past its stop time (under the lock)."""
        if self.state is GuardState.ARMED and time.monotonic() >= self._deadline:
            self._move(Move.STOP_TIME_OVER)
        return self.state

    def _move(self, move: Move) -> GuardState:
        """Take ``move`` if the table allows it (under the lock); return the state."""
        # Not `StateTable.move`: the guard's moves race the signals and the
        # stop time, and one that comes too late is simply not taken.
        self.state = TABLE.transitions.get((self.state, move), self.state)
        return self.state

    def _send(self, byte: int) -> None:
        # Safe in a signal handler; a full pipe already holds a wake-up.
        if self._write_fd != -1:  # else never armed: no thread to wake
            with contextlib.suppress(BlockingIOError):
                os.write(self._write_fd, bytes([byte]))

    def _read_pipe(self) -> bytes:
        data = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self._read_fd, 512):
                data += chunk
        return data


def _threads_keeping_the_exit() -> str:
    """The threads that are not daemons, still running, but the main one."""
    main = threading.main_thread()
    names = [
        repr(t.name)
        for t in threading.enumerate()
        if t is not main and not t.daemon and t.is_alive()
    ]
    return ", ".join(names)


def _flush_output() -> None:
    """Flush the runner's log and Python's standard streams, before ``os._exit``."""
    log: logging.Logger | None = logger
    while log is not None:
        for handler in log.handlers:
            handler.flush()
        log = log.parent if log.propagate else None
    if logging.lastResort is not None:
        logging.lastResort.flush()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


_guard: ExitGuard | None = None
_guard_lock = threading.Lock()


def exit_guard() -> ExitGuard:
    """The process's one `ExitGuard` (see the module docstring for why one)."""
    global _guard
    with _guard_lock:
        if _guard is None:
            _guard = ExitGuard()
        return _guard


def current_exit_guard() -> ExitGuard | None:
    """The process's guard if a run has made one; None otherwise."""
    return _guard
