"""The watchdog's emergency exit, in real subprocesses (it ends the process).

examples/stdio_service.py covers the signal-driven cases; these cover the
deadlines the watchdog keeps without any further signal: the unwind budget
after a grace that ran out, and grace plus unwind budget after one signal
that a frozen Trio thread never saw.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.realtime

PROGRAM = textwrap.dedent(
    """
    import sys, time
    import trio
    import trio_graceful

    async def stuck():
        with trio.CancelScope(shield=True):
            await trio.sleep_forever()

    async def main(mode):
        runner = trio_graceful.current_runner()
        runner.root.start_soon(stuck, name="stuck")
        await trio.sleep(0)
        print("ready", time.monotonic(), flush=True)
        if mode == "freeze":
            time.sleep(600)  # Trio never runs again

    codes = trio_graceful.ExitCodes(emergency=99)
    sys.exit(trio_graceful.run(
        main, sys.argv[1], grace=0.3, unwind_budget=0.4, exit_codes=codes,
        signals=() if sys.argv[1] == "no-signals" else (2, 15),
    ))
    """
)


def start(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[bytes], float]:
    """Start the program; return it and when it was ready, on its own clock.

    CLOCK_MONOTONIC is the same for every process, so an interval measured
    from the child's timestamp does not shrink when this process is slow to
    read the line.
    """
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    process = subprocess.Popen(
        [sys.executable, str(script), mode],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    word, ready_at = process.stdout.readline().split()
    assert word == b"ready"
    return process, float(ready_at)


def finish(process: subprocess.Popen[bytes], since: float) -> tuple[int, float, str]:
    """Wait for the exit; return the status, the seconds since ``since``, stderr."""
    _, stderr = process.communicate(timeout=30)
    return process.returncode, time.monotonic() - since, stderr.decode()


def test_a_hard_cancel_that_does_not_unwind_ends_after_the_budget(tmp_path):
    # No signal at all: main returns, the grace runs out on the stuck task,
    # and the hard cancel cannot reach it.
    # The shutdown begins when main returns, after it printed "ready".
    status, elapsed, stderr = finish(*start(tmp_path, "no-signals"))
    assert status == 99
    assert 0.3 + 0.4 <= elapsed < 0.3 + 0.4 + 20
    # The budget counts from the hard cancel at the end of the grace, which
    # is also the end of "grace + budget" counted from the shutdown's start.
    assert stderr.startswith(
        "forcing: the grace 0.3 s ran out\n"
        "emergency exit: the shutdown did not finish within the grace of 0.3 s "
        "and the unwind budget of 0.4 s\n"
        "tasks still running:\n"
    )
    assert "\n    stuck\n" in stderr
    assert "Traceback" not in stderr


def test_one_signal_to_a_frozen_program_ends_after_grace_and_budget(tmp_path):
    process, _ = start(tmp_path, "freeze")
    time.sleep(0.1)
    signalled_at = time.monotonic()  # the deadlines count from a later moment
    process.send_signal(signal.SIGTERM)
    status, elapsed, stderr = finish(process, signalled_at)
    assert status == 99
    assert 0.3 + 0.4 <= elapsed < 0.3 + 0.4 + 20
    # Trio never saw the signal: the only lines are the watchdog's.
    assert stderr.startswith(
        "emergency exit: the shutdown did not finish within the grace of 0.3 s "
        "and the unwind budget of 0.4 s\ntasks still running:\n"
    )
    assert "in main\n" in stderr
    assert "Traceback" not in stderr


EXIT_AT_ONCE = textwrap.dedent(
    """
    import sys
    import trio
    import trio_graceful

    async def main():
        _, inbox = trio_graceful.current_runner().root.open_inbox()
        print("ready", flush=True)
        await inbox.receive()  # STOP
        try:
            await trio.sleep_forever()  # a drain that takes its time
        finally:
            print("unwound", flush=True)

    sys.exit(trio_graceful.run(main, grace=60, second_signal="exit"))
    """
)


def start_ready(tmp_path: Path, source: str) -> subprocess.Popen[bytes]:
    """Start a program that prints "ready"; return it once it has."""
    script = tmp_path / "program.py"
    script.write_text(source)
    process = subprocess.Popen(
        [sys.executable, str(script)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    assert process.stdout.readline() == b"ready\n"
    return process


def test_second_signal_exit_ends_the_process_without_unwinding(tmp_path):
    process = start_ready(tmp_path, EXIT_AT_ONCE)
    process.send_signal(signal.SIGTERM)
    # The second signal only once the first was handled: when both are
    # pending together, CPython runs their handlers in the order of their
    # numbers, SIGINT (2) before SIGTERM (15).
    assert process.stderr is not None
    assert process.stderr.readline() == b"SIGTERM: shutting down (grace 60 s)\n"
    start_time = time.monotonic()
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=30)
    elapsed = time.monotonic() - start_time
    assert process.returncode == 128 + signal.SIGTERM
    # Far below the 60 s grace: it did not wait for the drain. (How fast
    # it exits is for a benchmark, not for a test on a shared machine.)
    assert elapsed < 10
    assert stdout == b""  # no finally block ran
    assert stderr.decode() == "exiting at once: SIGINT again\n"


DELAYED = textwrap.dedent(
    """
    import sys, time
    import trio_graceful

    async def main():
        _, inbox = trio_graceful.current_runner().root.open_inbox()
        print("ready", flush=True)
        await inbox.receive()  # STOP, once the drain delay is over
        print("stop", time.monotonic(), flush=True)

    sys.exit(trio_graceful.run(
        main, drain_delay=2, grace=0.5, unwind_budget=1,
        exit_codes=trio_graceful.ExitCodes(emergency=99),
    ))
    """
)


def test_the_watchdog_allows_the_drain_delay_too(tmp_path):
    # Without the delay in its deadline, the watchdog would end the process
    # 1.5 s after the signal, in the middle of the 2 s delay.
    process = start_ready(tmp_path, DELAYED)
    signalled_at = time.monotonic()
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=60)
    assert (process.returncode, stderr.decode().splitlines()[:1]) == (
        0,
        [
            "SIGTERM: not ready; serving 2 s more (drain delay), then shutting "
            "down (grace 0.5 s)"
        ],
    )
    word, stopped_at = stdout.split()
    assert word == b"stop"
    assert float(stopped_at) - signalled_at >= 2
