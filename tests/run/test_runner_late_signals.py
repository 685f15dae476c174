"""Signals after the run: what `trio_graceful.run` leaves in place when it returns.

A run that took a signal hands its handlers to the process's exit guard,
which ends the process at the next signal until the stop time is over, and
then gives the previous handlers back; a run that took none gives the
previous handlers back itself (test_runner.py checks that). Here the guard
only records the status it would end the test process with (the
``process_ends`` fixture of conftest.py); test_exit_guard.py ends real
processes. The storms of test_signal_storms.py check the same with many
signals at once; these check each step on its own, with exact log lines.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import trio
import trio.testing

import trio_graceful
from tests.conftest import ProcessEnds
from tests.support.processes import PATIENCE
from trio_graceful import current_runner
from trio_graceful._run._exit import _guard
from trio_graceful._run._exit._guard import GuardState
from trio_graceful._run._signals._escalation import Observer

SHUTDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def run(main: Callable[..., Awaitable[None]], **options: Any) -> int:
    options.setdefault("clock", trio.testing.MockClock(autojump_threshold=0))
    return trio_graceful.run(main, **options)


def handlers() -> dict[int, object]:
    return {s: signal.getsignal(s) for s in SHUTDOWN_SIGNALS}


def runner_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "trio_graceful.runner"]


async def stopped_by_sigterm() -> None:
    _, inbox = current_runner().root.open_inbox()
    signal.raise_signal(signal.SIGTERM)
    await inbox.receive()  # STOP


def test_after_a_signal_the_next_one_ends_the_process_at_once(
    caplog: pytest.LogCaptureFixture, process_ends: ProcessEnds
) -> None:
    caplog.set_level(logging.WARNING, logger="trio_graceful.runner")
    before = handlers()
    assert run(stopped_by_sigterm) == 0
    kept = handlers()
    assert all(kept[s] is not before[s] for s in SHUTDOWN_SIGNALS)
    # The process is on its way out: the next signal ends it, neither by
    # its default action nor by raising, but with 128 + its number.
    signal.raise_signal(signal.SIGINT)
    assert process_ends.wait() == [130]
    assert runner_lines(caplog) == [
        "SIGTERM: shutting down (grace 10 s)",
        "exiting at once: SIGINT after the run",
    ]


def test_at_the_last_exit_step_the_guards_handlers_become_ignored() -> None:
    assert run(stopped_by_sigterm) == 0
    mine = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # What atexit runs: the handlers become SIG_IGN, which the interpreter's
    # finalization leaves alone; one installed since is left alone.
    _guard.exit_guard()._last_step()  # pyright: ignore[reportPrivateUsage]
    assert handlers() == {
        signal.SIGINT: signal.default_int_handler,
        signal.SIGTERM: signal.SIG_IGN,
    }
    assert mine is not signal.SIG_IGN
    assert _guard.exit_guard().state is GuardState.CLOSED


@pytest.mark.realtime
def test_a_program_that_goes_on_past_its_stop_time_gets_its_handlers_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trio_graceful.runner")
    before = handlers()
    # A stop time of 0 s, and the second the watchdog allows a busy thread.
    assert run(stopped_by_sigterm, grace=0, unwind_budget=0) == 143
    guard = _guard.exit_guard()
    deadline = time.monotonic() + PATIENCE
    while guard.state is not GuardState.IDLE:  # it stands down by itself
        assert time.monotonic() < deadline, "the guard did not stand down"
        time.sleep(0.01)
    # The guard's thread may still hold its lock just after standing down;
    # a signal meanwhile would be passed on later, from that thread, and
    # not raise here and now.
    with guard._lock:  # pyright: ignore[reportPrivateUsage]
        pass
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)  # Python's own handler, again
    assert handlers() == before
    assert runner_lines(caplog) == [
        "SIGTERM: shutting down (grace 0 s)",
        "forcing: the grace 0 s ran out",
    ]


def test_a_later_run_takes_over_and_gives_the_kept_handlers_back() -> None:
    assert run(stopped_by_sigterm) == 0
    kept = handlers()

    async def main() -> None:
        assert all(handlers()[s] is not kept[s] for s in SHUTDOWN_SIGNALS)

    # Not ignored: the kept handlers are the first run's, not SIG_IGN.
    assert run(main) == 0
    assert handlers() == kept


def test_a_signal_waiting_as_the_run_returns_is_the_runs(
    caplog: pytest.LogCaptureFixture, process_ends: ProcessEnds
) -> None:
    # A signal that arrived before run() gave the handlers back belongs to
    # the run, even if the main thread had it blocked: given to the previous
    # handler, it would kill a process on its way out. It came after the
    # run, so it ends the process at once.
    received: list[int] = []

    def previous(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    async def main() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        signal.raise_signal(signal.SIGTERM)  # waits, blocked

    signal.signal(signal.SIGTERM, previous)
    try:
        assert run(main) == 0  # main returned first
        assert signal.getsignal(signal.SIGTERM) is not previous
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    assert process_ends.wait() == [143]
    assert received == []
    assert runner_lines(caplog)[-1] == "exiting at once: SIGTERM after the run"


def signal_mask(thread: threading.Thread) -> set[int]:
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    found = re.search(r"^SigBlk:\s*([0-9a-f]+)$", status, re.MULTILINE)
    assert found is not None
    bits = int(found[1], 16)
    return {s for s in SHUTDOWN_SIGNALS if bits >> (s - 1) & 1}


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="Linux only")
def test_the_watchdog_thread_never_takes_a_shutdown_signal() -> None:
    masks: list[set[int]] = []

    async def main() -> None:
        [watchdog] = [
            t for t in threading.enumerate() if t.name == "trio_graceful watchdog"
        ]
        masks.append(signal_mask(watchdog))
        masks.append(signal_mask(threading.current_thread()))

    assert run(main) == 0
    # Blocked in the watchdog, so the runner can hold them back while it
    # changes the handlers; never in the main thread.
    assert masks == [set(SHUTDOWN_SIGNALS), set()]


class WakeupFdAtTheEnd(trio.abc.Instrument):
    """Finds what the signal wakeup fd is once the run's root task has ended."""

    def __init__(self) -> None:
        self.kinds: list[str] = []

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        if task is trio.lowlevel.current_root_task():
            fd = signal.set_wakeup_fd(-1)
            signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
            mode = os.fstat(fd).st_mode
            self.kinds.append("pipe" if stat.S_ISFIFO(mode) else "other")


def test_trios_wakeup_socket_is_not_the_wakeup_fd_when_trio_closes_it() -> None:
    # Trio closes its socket and then puts back the fd it found: meanwhile
    # CPython would write each signal to a closed socket and print a
    # BrokenPipeError. The watchdog's pipe stays the wakeup fd until then.
    instrument = WakeupFdAtTheEnd()

    async def main() -> None:
        trio.lowlevel.add_instrument(instrument)

    assert run(main) == 0
    assert instrument.kinds == ["pipe"]
    assert signal.set_wakeup_fd(-1) == -1


LATE = """
    import atexit
    import signal
    import sys
    import trio_graceful

    def last():
        print("atexit ran", flush=True)

    async def main():
        _, inbox = trio_graceful.current_runner().root.open_inbox()
        signal.raise_signal(signal.SIGINT)
        await inbox.receive()  # STOP

    atexit.register(last)
    status = trio_graceful.run(main)
    print("returned", status, flush=True)
    signal.raise_signal(signal.SIGTERM)
    signal.raise_signal(signal.SIGINT)
    # The guard's thread ends the process; the main thread goes on meanwhile.
    sys.exit(status)
"""


@pytest.mark.realtime
def test_a_late_signal_ends_the_process_with_its_own_status(tmp_path: Path) -> None:
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(LATE))
    done = subprocess.run(
        [sys.executable, str(script)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    # Its atexit function never runs: the first late signal, SIGTERM, ended
    # the process at once, with 128 + 15.
    assert (done.returncode, done.stdout.decode(), done.stderr.decode()) == (
        143,
        "returned 130\n",
        "SIGINT: shutting down (grace 10 s)\nexiting at once: SIGTERM after the run\n",
    )


def test_the_signal_counted_first_names_the_shutdown_and_its_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # With several signals pending, CPython runs their handlers in the order
    # of their numbers, while the watchdog reads them from the wakeup fd in
    # the order they came: it may count SIGTERM while the Trio thread's
    # handler runs for SIGINT first. The log and the status must agree.
    caplog.set_level(logging.WARNING, logger="trio_graceful.runner")

    async def main() -> None:
        runner = current_runner()
        _, inbox = runner.root.open_inbox()
        program = runner._run  # pyright: ignore[reportPrivateUsage]
        program.escalation.record(Observer.WATCHDOG, signal.SIGTERM)
        # What the handler passes to the Trio thread (the real watchdog
        # would count a raised signal a second time).
        program._on_signal(signal.SIGINT)  # pyright: ignore[reportPrivateUsage]
        await inbox.receive()  # STOP

    assert run(main) == 0  # SIGTERM's graceful status, not SIGINT's 130
    assert runner_lines(caplog) == ["SIGTERM: shutting down (grace 10 s)"]
