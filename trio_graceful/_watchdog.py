"""The emergency exit: a thread that ends the process when a shutdown cannot finish.

The watchdog is a plain daemon thread that sleeps in ``select()`` on a pipe
until a deadline. It ends the process with ``os._exit`` when

* the deadline passes: it is armed for ``grace + unwind budget`` when a
  shutdown begins and for ``unwind budget`` when the shutdown is forced (a
  hard cancel has to unwind within that budget), always keeping the earliest;
* the third shutdown signal arrives.

It must work when the Trio thread cannot run at all (stuck in a blocking call,
or in code that never reaches a checkpoint), so it counts signals itself,
without the Trio thread's help: while the run is going, the watchdog's pipe
is Python's *signal wakeup fd* (`signal.set_wakeup_fd`). CPython's C-level
signal handler writes the number of every signal to that fd the moment the
signal arrives, whatever the main thread is doing. The watchdog counts the
bytes and passes each one on to the wakeup fd Trio had installed, so Trio's
own signal handling is unchanged.

Before it exits, it logs one line (``emergency exit: ...``) and writes the
Trio task tree with await frames and the stack of every thread to stderr.
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
import faulthandler
import logging
import math
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Collection, Generator
from typing import Final, NoReturn

import trio

from ._tasktree import format_task_tree
from ._util import signal_name

logger = logging.getLogger("trio_graceful.runner")

REPORT_TIMEOUT: Final = 1.0
"""Seconds the emergency report may take before ``os._exit`` runs anyway."""

# Signal numbers are never 0, so a 0 byte on the pipe only wakes the thread.
_WAKE: Final = b"\x00"


class Watchdog:
    """Ends the process with ``os._exit(exit_code)`` when a shutdown hangs.

    Args:
        grace: The run's grace period, in seconds.
        unwind_budget: Seconds a hard cancel may take to unwind.
        signals: The shutdown signals to count.
        exit_code: The status ``os._exit`` is given.
    """

    def __init__(
        self,
        *,
        grace: float,
        unwind_budget: float,
        signals: Collection[int],
        exit_code: int,
    ) -> None:
        self._grace = grace
        self._unwind_budget = unwind_budget
        self._signals = frozenset(signals)
        self._exit_code = exit_code
        self._lock = threading.Lock()
        self._deadline = math.inf  # time.monotonic()
        self._deadline_reason = ""
        self._signals_seen = 0
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

    def start(self) -> None:
        """Start the thread."""
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
        self._arm(
            self._grace + self._unwind_budget,
            f"the shutdown did not finish within the grace of {self._grace:g} s "
            f"and the unwind budget of {self._unwind_budget:g} s",
        )

    def hard_cancel_began(self) -> None:
        """Exit unless the hard cancel has unwound within the unwind budget."""
        self._arm(
            self._unwind_budget,
            f"tasks did not unwind within {self._unwind_budget:g} s of the hard cancel",
        )

    def _arm(self, seconds: float, reason: str) -> None:
        # The earliest deadline wins.
        if seconds == math.inf:
            return
        deadline = time.monotonic() + seconds
        with self._lock:
            if deadline >= self._deadline:
                return
            self._deadline = deadline
            self._deadline_reason = reason
        self._wake()

    def count_signal(self, signum: int) -> None:
        """Count a signal that reached the process before the wakeup fd was ours."""
        self._on_signal(signum)

    @contextlib.contextmanager
    def counting_signals(self) -> Generator[None, None, None]:
        """Make the watchdog's pipe the signal wakeup fd while the block runs.

        Must be entered in the main thread inside the Trio run, after the
        Python-level handlers for the signals are installed (CPython writes
        to the wakeup fd only for signals that have one).
        """
        previous = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        with self._lock:
            self._forward_fd = previous
        try:
            yield
        finally:
            with self._lock:
                self._forward_fd = -1
            signal.set_wakeup_fd(previous)

    # -- the thread --------------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self._write_fd, _WAKE)

    def _watch(self) -> None:
        while True:
            with self._lock:
                if self._stopping:
                    return
                deadline, reason = self._deadline, self._deadline_reason
            timeout = None
            if deadline != math.inf:
                timeout = deadline - time.monotonic()
                if timeout <= 0:
                    self._emergency(reason)
            readable, _, _ = select.select([self._read_fd], [], [], timeout)
            if not readable:
                continue
            try:
                data = os.read(self._read_fd, 512)
            except BlockingIOError:
                continue
            signal_bytes = data.replace(_WAKE, b"")
            if signal_bytes:
                self._forward(signal_bytes)
            for signum in signal_bytes:
                if signum in self._signals:
                    self._on_signal(signum)

    def _forward(self, data: bytes) -> None:
        # Under the lock: once counting_signals() has taken the fd back, no
        # write can reach it (its number may be reused after the run).
        with self._lock:
            if self._forward_fd != -1:
                # Trio only needs to be woken; a full fd is no loss.
                with contextlib.suppress(OSError):
                    os.write(self._forward_fd, data)

    def _on_signal(self, signum: int) -> None:
        with self._lock:
            self._signals_seen += 1
            seen = self._signals_seen
        if seen == 1:
            self.shutdown_began()
        elif seen == 2:
            self.hard_cancel_began()
        else:
            self._emergency(f"{signal_name(signum)} received a third time")

    def _emergency(self, reason: str) -> NoReturn:
        done = threading.Event()

        def report() -> None:
            try:
                logger.critical("emergency exit: %s", reason)
                text = "tasks still running:\n"
                if self.root_task is not None:
                    text += format_task_tree(self.root_task)
                _write_all(2, text.encode(errors="backslashreplace"))
                faulthandler.dump_traceback(2, all_threads=True)
                for stream in (sys.stdout, sys.stderr):
                    if stream is not None:
                        stream.flush()
            except Exception as exc:
                with contextlib.suppress(OSError):
                    _write_all(2, f"emergency report failed: {exc!r}\n".encode())
            finally:
                done.set()

        threading.Thread(
            target=report, name="trio_graceful emergency report", daemon=True
        ).start()
        done.wait(REPORT_TIMEOUT)
        os._exit(self._exit_code)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
