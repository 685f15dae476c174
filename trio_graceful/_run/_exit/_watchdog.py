"""The emergency exit: a thread that ends the process when a shutdown cannot finish.

The watchdog is a plain daemon thread that sleeps in ``select()`` on a pipe
until a deadline. It ends the process with ``os._exit`` when

* the deadline passes: it is armed for ``grace + unwind budget`` when a
  shutdown begins and for ``unwind budget`` when the shutdown is forced (a
  hard cancel has to unwind within that budget), always keeping the earliest.
  If the Trio thread is busy (unwinding, or stuck in a blocking call or a
  loop) it gets up to `BUSY_ALLOWANCE` more, counted by ``_lateness`` (time
  spent waiting for a CPU on a loaded machine does not count, up to
  `STARVED_LIMIT`). If it waits with nothing to run (an instrument tells),
  waiting longer is pointless: one wait that lasts `IDLE_ALLOWANCE`, counted
  the same way, ends it. A wait that a pending wake-up ends at once (Trio
  waits so at the very end of every run) does not: the thread returns
  before it has waited that long, however loaded the machine. So a
  program with nothing left to unwind is never killed by a zero budget
  because its last steps took a few milliseconds;
* the signal count reaches a step of `ESCALATION` that exits (the third
  signal, or the second with ``second_signal="exit"``).

It must work when the Trio thread cannot run at all (stuck in a blocking call,
or in code that never reaches a checkpoint), so it sees signals itself,
without the Trio thread's help, and records them in the run's one
`Escalation` (which also tells the Trio thread of steps it has missed): while
the run is going, the watchdog's pipe
is Python's *signal wakeup fd* (`signal.set_wakeup_fd`). CPython's C-level
signal handler writes the number of every signal to that fd the moment the
signal arrives, whatever the main thread is doing. The watchdog counts the
bytes and passes each one on to the wakeup fd Trio had installed, so Trio's
own signal handling is unchanged.

Before it exits, it logs one line (``emergency exit: ...``) and writes the
Trio task tree with await frames and the stack of every other thread to
stderr; the frames of trio and trio_graceful are summed up in one line each
unless `show_internals` is set.
This reporting runs in a helper thread and gets at most `REPORT_TIMEOUT`
seconds (logging or a full stderr pipe must not keep the process alive);
then ``os._exit`` runs regardless.

Limits: a thread holding the GIL without ever releasing it (native code in a
tight loop) stops every other thread, this one included; only SIGKILL ends
that. The report is read while the Trio thread may still run (see
``_tasktree``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection, Generator
from typing import Final, NoReturn

import trio

from ..._core._log import library_logger
from ..._core._lowlevel import signal_name
from .._shutdown._stoptime import BUSY_ALLOWANCE, REPORT_TIMEOUT, Part, StopTimes
from .._signals._escalation import Escalation, Observer, Step
from .._signals._relay import blocked
from ._lateness import Lateness
from ._status import Ending, ExitCodes, exit_status
from ._tasktree import format_task_tree, format_thread_stacks

logger = library_logger("trio_graceful.runner")

IDLE_ALLOWANCE: Final = 0.05
"""Seconds past its deadline that one idle wait of the Trio thread may last."""

STARVED_LIMIT: Final = 30.0
"""Seconds past its deadline after which the watchdog exits whatever the thread does."""

# How often a busy Trio thread is looked at once its deadline has passed.
_BUSY_POLL: Final = 0.01

# The longest single wait: select() refuses timeouts beyond the platform's
# time_t, so a far deadline is waited for in steps.
_LONGEST_WAIT: Final = 86_400.0

# Signal numbers are never 0, so a 0 byte on the pipe only wakes the thread.
_WAKE: Final = b"\x00"


class _TrioIdle(trio.abc.Instrument):
    """Knows whether the Trio thread waits for I/O or time with nothing to run."""

    def __init__(self) -> None:
        # Plain ints: written by the Trio thread, read by the watchdog's.
        self.wait = 0
        """The number of the idle wait under way, 0 while the thread runs."""
        self._waits = 0

    def before_io_wait(self, timeout: float) -> None:
        if timeout > 0:
            self._waits += 1
            self.wait = self._waits

    def after_io_wait(self, timeout: float) -> None:
        self.wait = 0


class _Overdue:
    """How much more time a Trio thread past its deadline has used, and how."""

    def __init__(self, lateness: Lateness, trio_idle: _TrioIdle) -> None:
        self._lateness = lateness
        self._trio = trio_idle
        self._used = 0.0
        self._wait = 0
        self._idle = 0.0
        self.remaining = BUSY_ALLOWANCE
        """Seconds left of the allowance, as of the last `spent` call."""

    def spent(self) -> bool:
        """Whether the thread has used its allowance, busy or idle."""
        used = self._lateness.update()
        wait = self._trio.wait
        # Only one wait seen at both ends of an interval counts as idle: a
        # wait begun and ended between two looks was not one to end.
        if wait and wait == self._wait:
            self._idle += used - self._used
        else:
            self._idle = 0.0
        self._used, self._wait = used, wait
        self.remaining = min(BUSY_ALLOWANCE - used, IDLE_ALLOWANCE - self._idle)
        return self.remaining <= 0


class Watchdog:
    """Ends the process with ``os._exit`` when a shutdown hangs.

    Args:
        times: The run's drain delay, grace and unwind budget; its deadlines
            are what `StopTimes.time_left` says.
        signals: The shutdown signals to count.
        exit_codes: The run's exit statuses.
        escalation: The run's signal count, shared with the Trio thread.
    """

    def __init__(
        self,
        *,
        times: StopTimes,
        signals: Collection[int],
        exit_codes: ExitCodes,
        escalation: Escalation,
    ) -> None:
        self._times = times
        self._signals = frozenset(signals)
        self._exit_codes = exit_codes
        self._escalation = escalation
        self._lock = threading.Lock()
        self._exiting = threading.Lock()
        self._deadline = math.inf  # time.monotonic()
        self._deadline_reason = ""
        self._stopping = False
        # Trio's wakeup fd, to which signal bytes are passed on; -1 if none.
        self._forward_fd = -1
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)  # required of a wakeup fd
        self._thread = threading.Thread(
            target=self._watch, name="trio_graceful watchdog", daemon=True
        )
        self.root_task: trio.lowlevel.Task | None = None
        """The task whose tree the emergency report shows."""
        self._trio = _TrioIdle()
        # Made in the thread that will run Trio (see Program).
        self._lateness = Lateness(threading.get_ident(), threading.get_native_id())
        self.instrument: trio.abc.Instrument = self._trio
        """Pass it to `trio.run`: it tells the watchdog when Trio is idle."""
        self.wake_trio: Callable[[], object] | None = None
        """Thread-safe; asks the Trio thread to catch up on the escalation."""
        self.show_internals = False
        """Whether the report shows the frames of trio and trio_graceful."""

    def start(self) -> None:
        """Start the thread, which never takes the signals it counts.

        Those go to the main thread (or others), which can then hold them
        back while the runner changes their handlers (see ``_signals._relay``).
        """
        with blocked(self._signals):  # the new thread inherits the mask
            self._thread.start()

    def stop(self) -> None:
        """Disarm, end the thread and close the pipe. Call it once, after `start`."""
        with self._lock:
            self._stopping = True
        self._wake()
        self._thread.join()
        os.close(self._read_fd)
        os.close(self._write_fd)

    def shutdown_began(self) -> None:
        """Exit unless the shutdown ends within the grace plus the unwind budget.

        Thread-safe and non-blocking, like `hard_cancel_began`.
        """
        self._allow(Part.GRACE)

    def withdrawal_began(self) -> None:
        """As `shutdown_began`, allowing the drain delay before the grace too."""
        self._allow(Part.DRAIN_DELAY)

    def _allow(self, part: Part) -> None:
        times = self._times
        delay = (
            f"the drain delay of {times.drain_delay:g} s, "
            if part is Part.DRAIN_DELAY and times.drain_delay
            else ""
        )
        self._arm(
            times.time_left(part),
            f"the shutdown did not finish within {delay}the grace of "
            f"{times.grace:g} s and the unwind budget of {times.unwind_budget:g} s",
        )

    def hard_cancel_began(self) -> None:
        """Exit unless the hard cancel has unwound within the unwind budget."""
        unwind = self._times.unwind_budget
        self._arm(
            self._times.time_left(Part.UNWIND),
            f"tasks did not unwind within {unwind:g} s of the hard cancel",
        )

    def _arm(self, seconds: float, reason: str) -> None:
        # The earliest deadline wins; an infinite one never comes.
        deadline = time.monotonic() + seconds
        if deadline == math.inf:
            return
        with self._lock:
            if deadline >= self._deadline:
                return
            self._deadline = deadline
            self._deadline_reason = reason
        self._wake()

    def do_step(self, step: Step, signum: int) -> None:
        """Do the watchdog's part of an escalation ``step`` caused by ``signum``."""
        if step is Step.SHUT_DOWN:
            # The longest the first signal may lead to; the runner arms an
            # earlier deadline if the program, not ready, skips the delay.
            self.withdrawal_began()
        elif step is Step.FORCE:
            self.hard_cancel_began()
        elif step is Step.EXIT_NOW:
            first = self._escalation.first_signal
            status = exit_status(
                self._exit_codes, Ending(first_signal=first, forced_by="signal")
            )
            self._exit(f"exiting at once: {signal_name(signum)} again", status)
        else:
            self.emergency(f"{signal_name(signum)} received a third time")

    def emergency(self, reason: str) -> NoReturn:
        """Report what is still running and exit with `ExitCodes.emergency`."""
        self._exit(f"emergency exit: {reason}", self._exit_codes.emergency, report=True)

    @contextlib.contextmanager
    def counting_signals(self) -> Generator[None, None, None]:
        """Make the watchdog's pipe the signal wakeup fd while the block runs.

        Must be entered in the main thread inside the Trio run, after the
        Python-level handlers for the signals are installed (CPython writes
        to the wakeup fd only for signals that have one). Signals are
        counted until the block ends; the pipe stays the wakeup fd until
        Trio puts back the one it found at the end of the run.
        """
        previous = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        with self._lock:
            self._forward_fd = previous
        try:
            yield
        finally:
            with self._lock:
                self._forward_fd = -1
            # The pipe stays the wakeup fd, its bytes no longer counted:
            # Trio closes its socket before it puts back the fd it found,
            # and CPython would print a BrokenPipeError for each signal
            # written to that socket meanwhile. Trio's own wakeups do not
            # go through this fd; signals after the run need none.

    # -- the thread --------------------------------------------------------------

    def _stop_requested(self) -> bool:
        with self._lock:
            return self._stopping

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self._write_fd, _WAKE)

    def _watch(self) -> None:
        overdue: _Overdue | None = None
        while True:
            with self._lock:
                if self._stopping:
                    return
                deadline, reason = self._deadline, self._deadline_reason
            timeout = _LONGEST_WAIT
            if deadline != math.inf:
                timeout = min(timeout, deadline - time.monotonic())
                if timeout <= 0:
                    if overdue is None:
                        overdue = _Overdue(self._lateness, self._trio)
                    if overdue.spent() or -timeout >= STARVED_LIMIT:
                        # The run may have ended (stop() joins this thread)
                        # while this thread waited for a CPU.
                        if self._stop_requested():
                            return
                        self.emergency(reason)
                    timeout = min(_BUSY_POLL, overdue.remaining)
            readable, _, _ = select.select([self._read_fd], [], [], timeout)
            if not readable:
                continue
            try:
                data = os.read(self._read_fd, 512)
            except BlockingIOError:
                continue
            signal_bytes = data.replace(_WAKE, b"")
            if signal_bytes and self._forward(signal_bytes):
                for signum in signal_bytes:
                    if signum in self._signals:
                        self._on_signal(signum)

    def _forward(self, data: bytes) -> bool:
        """Pass signal bytes on to Trio; False once the counting has ended."""
        # Under the lock: once counting_signals() has ended, no write can
        # reach Trio's fd (its number may be reused after the run).
        with self._lock:
            if self._forward_fd == -1:
                return False
            # Trio only needs to be woken; a full fd is no loss.
            with contextlib.suppress(OSError):
                os.write(self._forward_fd, data)
            return True

    def _on_signal(self, signum: int) -> None:
        for step in self._escalation.record(Observer.WATCHDOG, signum):
            self.do_step(step, signum)
        wake_trio = self.wake_trio
        if wake_trio is not None and self._escalation.behind(Observer.TRIO):
            with contextlib.suppress(RuntimeError):  # the run has ended
                wake_trio()

    def _exit(self, message: str, status: int, *, report: bool = False) -> NoReturn:
        # Once: the Trio thread and this one may both decide to exit.
        self._exiting.acquire()
        done = threading.Event()

        def write_report() -> None:
            try:
                if report:
                    logger.critical("%s", message)
                    text = "tasks still running:\n"
                    if self.root_task is not None:
                        text += format_task_tree(
                            self.root_task, internals=self.show_internals
                        )
                    # Not this thread nor the watchdog's: their stacks
                    # only say that an emergency exit is under way.
                    ours = {self._thread.ident, threading.get_ident()}
                    text += format_thread_stacks(
                        skip={i for i in ours if i is not None},
                        internals=self.show_internals,
                    )
                    _write_all(2, text.encode(errors="backslashreplace"))
                else:
                    logger.warning("%s", message)
                logging.shutdown()  # flush what has been logged
                for stream in (sys.stdout, sys.stderr):
                    if stream is not None:
                        stream.flush()
            except Exception as exc:
                with contextlib.suppress(OSError):
                    _write_all(2, f"emergency report failed: {exc!r}\n".encode())
            finally:
                done.set()

        threading.Thread(
            target=write_report, name="trio_graceful emergency report", daemon=True
        ).start()
        done.wait(REPORT_TIMEOUT)
        os._exit(status)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
