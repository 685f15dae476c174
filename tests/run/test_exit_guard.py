"""The exit after a run that took a signal, in real processes with real signals.

A thread that is not a daemon and never ends (a file watcher, an executor's
worker stuck in a task, next to an MCP server) kept the interpreter waiting
forever after `trio_graceful.run` returned, deaf to every later signal. Now
the exit ends at the end of the stop time, naming the thread, or at once at
the next signal; and a program that goes on after `run` is left alone. Every
wait is for a line or an exit, bounded by ``PATIENCE``; no test sleeps.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio

from tests.support.mcp_wire import EXAMPLE, ServerProcess
from tests.support.processes import PATIENCE, LineReader, running
from trio_graceful._run._exit._guard import STATES, ExitGuard, GuardState, Move

PROGRAM = """
    import concurrent.futures
    import signal
    import sys
    import threading
    import time

    import trio_graceful

    kind, grace, unwind, then = sys.argv[1:]
    grace, unwind = float(grace), float(unwind)
    pools = []

    def never_ends():
        threading.Event().wait()

    # Registered first, so it runs after the guard's own: the exit has begun.
    threading._register_atexit(print, "exit began", flush=True)

    async def main():
        if kind == "thread":
            threading.Thread(target=never_ends, name="file watcher").start()
        elif kind == "executor":
            pool = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="model worker"
            )
            pool.submit(never_ends)
            pools.append(pool)
        _, inbox = trio_graceful.current_runner().root.open_inbox()
        print("ready", flush=True)
        await inbox.receive()  # STOP

    status = trio_graceful.run(main, grace=grace, unwind_budget=unwind)
    print("returned", status, flush=True)
    if then == "goes-on":
        time.sleep(2 * (grace + unwind + 1))  # twice its stop time
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            print("KeyboardInterrupt", flush=True)
        print("still here", flush=True)
    sys.exit(status)
"""

STACK = re.compile(r"^Thread 0x[0-9a-f]+ '(.*)' \(most recent call first\):$")


def start(tmp_path: Path, *args: object) -> list[str]:
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(PROGRAM))
    return [sys.executable, str(script), *map(str, args)]


def stacks(log: str) -> dict[str, str]:
    """The stacks in ``log``, by thread name."""
    found: dict[str, str] = {}
    name = None
    for line in log.splitlines():
        if match := STACK.match(line):
            name = match[1]
            found[name] = ""
        elif name is not None:
            found[name] += line + "\n"
    return found


def graceful(lines: list[str], signum: int, *, clean: bool) -> tuple[int, list[str]]:
    """The status the log calls for, and the log without a forcing line.

    A machine too busy to let ``main`` return within the grace forces the
    shutdown: then the log says so, and the status is a forced one.
    """
    forced = [line for line in lines if line.startswith("forcing: the grace")]
    status = 128 + signum if forced or not clean else 0
    return status, [line for line in lines if line not in forced]


def finish(process: subprocess.Popen[bytes], out: LineReader) -> tuple[int, str]:
    """Wait for the exit; return the status and the log, which has no traceback."""
    status = process.wait(PATIENCE)
    assert process.stderr is not None
    log = process.stderr.read().decode()
    out.rest()
    assert "Traceback" not in log, log
    assert "Exception ignored" not in log, log
    return status, log


pytestmark = pytest.mark.realtime


@pytest.mark.parametrize(
    ("kind", "thread"),
    [("thread", "file watcher"), ("executor", "model worker_0")],
)
def test_a_thread_that_never_ends_is_left_at_the_end_of_the_stop_time(
    tmp_path: Path, kind: str, thread: str
) -> None:
    with running(start(tmp_path, kind, 2, 0.5, "exits")) as process:
        assert process.stdout is not None
        out = LineReader(process.stdout)
        assert out.next() == "ready"
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        returned = out.until("returned")
        status, log = finish(process, out)
        elapsed = time.monotonic() - signalled
    expected, lines = graceful(log.splitlines(), signal.SIGTERM, clean=True)
    # The status run returned (SIGTERM's graceful shutdown): the thread was
    # left, the shutdown was not forced by it.
    assert (returned, status, lines[:2]) == (
        f"returned {expected}",
        expected,
        [
            "SIGTERM: shutting down (grace 2 s)",
            "exit cut short: still exiting 3.5 s after SIGTERM; "
            f"threads still running: {thread!r}",
        ],
    )
    # Not before the end of its stop time, which began after the signal was
    # sent. How soon after is the machine's business: the line says which
    # deadline ended it.
    assert elapsed >= 3.5  # grace + unwind budget + the busy allowance
    found = stacks(log)
    assert "in never_ends" in found[thread]
    assert "in _shutdown" in found["MainThread"]  # waiting for the thread


async def test_an_mcp_server_with_a_watcher_thread_ends_with_its_stop_time() -> None:
    program = textwrap.dedent(
        """
        import runpy, sys, threading
        import trio_graceful, trio_graceful.mcp

        def watch():
            threading.Event().wait()

        build_server = runpy.run_path(sys.argv[1])["build_server"]
        threading.Thread(target=watch, name="file watcher").start()
        sys.exit(trio_graceful.run(
            trio_graceful.mcp.serve_stdio, build_server(),
            grace=2, unwind_budget=0.5, exit_codes=trio_graceful.mcp.EXIT_CODES,
        ))
        """
    )
    async with trio.open_nursery() as nursery:
        server = await ServerProcess.start(
            nursery, [sys.executable, "-c", program, str(EXAMPLE)]
        )
        try:
            start = trio.current_time()
            server.kill(signal.SIGINT)
            status, elapsed = await server.exit_status(since=start)
            log = server.clean_stderr()
        finally:
            await server.stop()
            nursery.cancel_scope.cancel()
    # SIGINT is a clean stop for an MCP server: the status run returned.
    expected, lines = graceful(log.splitlines(), signal.SIGINT, clean=True)
    assert status == expected
    assert elapsed >= 3.5
    assert lines[-1].startswith("  File ")  # the stacks come last
    assert (
        "exit cut short: still exiting 3.5 s after SIGINT; "
        "threads still running: 'file watcher'"
    ) in lines
    assert "in watch" in stacks(log)["file watcher"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_during_the_exit_ends_the_process_at_once(
    tmp_path: Path, signum: signal.Signals
) -> None:
    with running(start(tmp_path, "thread", 30, 3, "exits")) as process:
        assert process.stdout is not None
        out = LineReader(process.stdout)
        assert out.next() == "ready"
        process.send_signal(signal.SIGTERM)
        assert out.until("exit began") == "exit began"
        signalled = time.monotonic()
        process.send_signal(signum)
        status, log = finish(process, out)
        elapsed = time.monotonic() - signalled
    assert (status, log) == (
        128 + signum,
        "SIGTERM: shutting down (grace 30 s)\n"
        f"exiting at once: {signum.name} after the run; "
        "threads still running: 'file watcher'\n",
    )
    assert elapsed < 33  # not the end of the stop time, 34 s away


def test_a_program_that_goes_on_after_the_run_is_left_alone(tmp_path: Path) -> None:
    # Its stop time is 2.5 s; it goes on for twice that, takes a Ctrl+C as
    # Python would (its handlers are back), and exits as it chooses.
    with running(start(tmp_path, "none", 1, 0.5, "goes-on")) as process:
        assert process.stdout is not None
        out = LineReader(process.stdout)
        assert out.next() == "ready"
        process.send_signal(signal.SIGTERM)
        status, log = finish(process, out)
    expected, lines = graceful(log.splitlines(), signal.SIGTERM, clean=True)
    assert (status, out.seen, lines) == (
        expected,
        [
            "ready",
            f"returned {expected}",
            "KeyboardInterrupt",
            "still here",
            "exit began",
        ],
        ["SIGTERM: shutting down (grace 1 s)"],
    )


def test_the_guards_table_leaves_every_other_move_unchanged() -> None:
    for state in GuardState:
        for move in Move:
            guard = ExitGuard(end=lambda status: None)
            guard.state = state
            expected = STATES.get((state, move), state)
            assert guard._move(move) is expected  # pyright: ignore[reportPrivateUsage]
            assert guard.state is expected
    # Once ending or closed, only a test's stand-down changes anything.
    for state in (GuardState.ENDING, GuardState.CLOSED):
        assert {m for (s, m) in STATES if s is state} == {Move.STAND_DOWN}
