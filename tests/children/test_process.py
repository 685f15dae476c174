"""run_process: real subprocesses receiving real signals.

The processes and signals are real, so these tests are marked realtime; but
Trio's clock is the mock clock without autojump, so Trio time stands still
unless a test moves it. A process that exits on SIGTERM therefore ends
"at once" in Trio time, and one that ignores it is killed at exactly the
grace, whatever the machine's speed.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import subprocess
import sys

import pytest
import trio
import trio.testing

from tests.support.exception_shapes import capture, only_child_error
from trio_graceful import ChildOutcome, open_bundle, run_process

pytestmark = pytest.mark.realtime

PYTHON = sys.executable

# Each program prints "ready" once its signal handlers are in place.
CLEANS_UP_ON_SIGTERM = """
import signal, sys, time
def on_term(signum, frame):
    print("cleaning up", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(60)
"""

IGNORES_SIGTERM = """
import signal, time
def on_term(signum, frame):
    print("ignoring SIGTERM", flush=True)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
while True:
    time.sleep(1)
"""

EXITS_ON_SIGINT = """
import signal, sys, time
signal.signal(signal.SIGINT, lambda signum, frame: sys.exit(0))
print("ready", flush=True)
time.sleep(60)
"""

SLEEPS = "import time; time.sleep(60)"


def python(code: str) -> list[str]:
    return [PYTHON, "-c", code]


async def read_line(stream: trio.abc.ReceiveStream) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = await stream.receive_some()
        assert chunk, f"end of output after {data!r}"
        data += chunk
    return data.rstrip(b"\n")


async def start_ready(bundle, code: str, **options) -> trio.Process:
    """Start ``code`` as a child of ``bundle``; return once it said "ready"."""
    process = await bundle.start(
        functools.partial(run_process, stdout=subprocess.PIPE, **options),
        python(code),
    )
    assert await read_line(process.stdout) == b"ready"
    return process


# -- the three endings --------------------------------------------------------------


async def test_process_that_exits_on_sigterm_ends_within_the_grace(mock_clock):
    t0 = trio.current_time()
    async with open_bundle(name="helpers") as bundle:
        process = await start_ready(bundle, CLEANS_UP_ON_SIGTERM)
        report = await bundle.shutdown(grace=10)
    assert await read_line(process.stdout) == b"cleaning up"
    assert process.returncode == 0
    assert trio.current_time() == t0
    assert report.graceful
    (child,) = report.children
    assert (child.outcome, child.elapsed) == (ChildOutcome.FINISHED, 0)
    assert child.notes == (
        f"process {process.pid} (python): got SIGTERM on STOP; exited with status 0",
    )


async def test_process_that_ignores_sigterm_is_killed_at_exactly_the_grace(
    mock_clock,
):
    t0 = trio.current_time()
    async with open_bundle(name="helpers") as bundle:
        process = await start_ready(bundle, IGNORES_SIGTERM)
        async with trio.open_nursery() as nursery:
            reports = []

            async def shut_down() -> None:
                reports.append(await bundle.shutdown(grace=5))

            nursery.start_soon(shut_down)
            # The signal really arrived, and was ignored.
            assert await read_line(process.stdout) == b"ignoring SIGTERM"
            assert trio.current_time() == t0
            mock_clock.jump(5)
    (report,) = reports
    assert process.returncode == -signal.SIGKILL
    assert report.hard_cancelled_at == t0 + 5
    assert report.elapsed == 5
    (child,) = report.children
    assert (child.outcome, child.elapsed) == (ChildOutcome.CANCELLED, 5)
    assert child.notes == (
        f"process {process.pid} (python): got SIGTERM on STOP; "
        f"got SIGKILL at the hard cancel; ended by SIGKILL",
    )


async def test_process_that_exits_by_itself_returns_its_output(mock_clock):
    results: list[subprocess.CompletedProcess[bytes]] = []

    async def child() -> None:
        results.append(await run_process(python("print('hello')"), capture_stdout=True))

    async with open_bundle() as bundle:
        bundle.start_soon(child)
    (completed,) = results
    assert (completed.returncode, completed.stdout) == (0, b"hello\n")


async def test_process_that_exits_by_itself_during_a_cancellation(mock_clock):
    # cancel() without STOP: the process is not signalled, only waited for.
    async with open_bundle() as bundle:
        process = await start_ready(bundle, "import sys; print('ready', flush=True)")
        report = await bundle.cancel(grace=10)
    (child,) = report.children
    assert (child.outcome, child.elapsed) == (ChildOutcome.FINISHED, 0)
    assert child.notes == (f"process {process.pid} (python): exited with status 0",)


# -- signals and exit statuses ------------------------------------------------------


async def test_default_sigterm_death_is_not_an_error(mock_clock):
    results: list[subprocess.CompletedProcess[bytes]] = []

    async def child() -> None:
        # check=True, and yet: dying of the signal it was asked to stop with
        # is the expected ending.
        results.append(await run_process(python(SLEEPS)))

    async with open_bundle() as bundle:
        bundle.start_soon(child, name="sleeper")
        await trio.testing.wait_all_tasks_blocked()
        report = await bundle.shutdown(grace=10)
    (completed,) = results
    assert completed.returncode == -signal.SIGTERM
    (note,) = report.children[0].notes
    assert re.fullmatch(
        r"process \d+ \(python\): got SIGTERM on STOP; ended by SIGTERM", note
    )


async def test_stop_signal_is_configurable(mock_clock):
    async with open_bundle() as bundle:
        process = await start_ready(bundle, EXITS_ON_SIGINT, stop_signal=signal.SIGINT)
        report = await bundle.shutdown(grace=10)
    assert process.returncode == 0
    assert report.children[0].notes == (
        f"process {process.pid} (python): got SIGINT on STOP; exited with status 0",
    )


async def test_real_time_signals_are_named_by_number(mock_clock):
    number = signal.SIGRTMIN + 2
    results: list[subprocess.CompletedProcess[bytes]] = []

    async def child() -> None:
        results.append(await run_process(python(SLEEPS), stop_signal=number))

    async with open_bundle() as bundle:
        bundle.start_soon(child)
        await trio.testing.wait_all_tasks_blocked()
        report = await bundle.shutdown(grace=10)
    # Its default action ends the process: what was asked, so no error.
    assert results[0].returncode == -number
    (note,) = report.children[0].notes
    assert re.fullmatch(
        rf"process \d+ \(python\): got signal {number} on STOP; "
        rf"ended by signal {number}",
        note,
    )


async def test_stop_before_the_process_started_signals_it_at_once(mock_clock):
    returncodes: list[int] = []

    async def late_helper() -> None:
        completed = await run_process(python(SLEEPS))
        returncodes.append(completed.returncode)

    async def dispatcher() -> None:
        _, inbox = bundle.open_inbox()
        await inbox.receive()  # STOP
        bundle.start_soon(late_helper)

    async with open_bundle() as bundle:
        bundle.start_soon(dispatcher)
        await trio.testing.wait_all_tasks_blocked()
        report = await bundle.shutdown(grace=10)
    assert returncodes == [-signal.SIGTERM]
    assert report.graceful


async def test_failure_raises_called_process_error_like_a_trio_child(mock_clock):
    async def body() -> None:
        async with open_bundle() as bundle:
            bundle.start_soon(run_process, python("raise SystemExit(3)"))

    got = await capture(body)
    error = only_child_error(got, subprocess.CalledProcessError)
    assert error.returncode == 3


async def test_death_by_another_signal_is_a_failure(mock_clock):
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    results: list[int] = []

    async def child() -> None:
        with pytest.raises(subprocess.CalledProcessError) as info:
            await run_process(python(code))
        results.append(info.value.returncode)
        completed = await run_process(python(code), check=False)
        results.append(completed.returncode)

    async with open_bundle() as bundle:
        bundle.start_soon(child)
    assert results == [-signal.SIGKILL, -signal.SIGKILL]


async def test_hard_cancel_from_outside_kills_and_raises_plain_cancelled(mock_clock):
    caught: list[BaseException] = []

    async def child() -> None:
        try:
            await run_process(python(SLEEPS))
        except BaseException as exc:
            caught.append(exc)
            raise

    async with open_bundle() as bundle:
        process = await start_ready(bundle, CLEANS_UP_ON_SIGTERM)
        bundle.start_soon(child)
        await trio.testing.wait_all_tasks_blocked()
        bundle.cancel_scope.cancel()
    assert [type(exc) for exc in caught] == [trio.Cancelled]
    # SIGKILL, not SIGTERM: the process had no chance to clean up.
    assert process.returncode == -signal.SIGKILL


async def test_program_not_found_raises_os_error_plainly():
    async def child() -> None:
        with pytest.raises(FileNotFoundError):
            await run_process(["/nonexistent/program"])

    async with open_bundle() as bundle:
        bundle.start_soon(child)


# -- process groups ------------------------------------------------------------------

# A shell that starts a Python grandchild and waits for it. The grandchild
# prints its pid once its handlers are in place; "trap '' TERM" in the shell
# makes both of them deaf to SIGTERM (an ignored signal stays ignored across
# fork and exec).
GRANDCHILD = """
import os, signal, sys, time
def on_term(signum, frame):
    print("grandchild: got SIGTERM", flush=True)
    sys.exit(0)
if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
    signal.signal(signal.SIGTERM, on_term)
print(os.getpid(), flush=True)
time.sleep(60)
"""


def shell_with_grandchild(*, deaf: bool = False) -> list[str]:
    trap = "trap '' TERM; " if deaf else ""
    return ["sh", "-c", f'{trap}"$0" -c "$1" & wait', PYTHON, GRANDCHILD]


async def read_to_end(stream: trio.abc.ReceiveStream) -> bytes:
    """Read until every process holding the pipe's other end has gone."""
    data = b""
    with trio.fail_after(30):  # real time; EOF comes at once when it works
        while chunk := await stream.receive_some():
            data += chunk
    return data


async def test_process_runs_in_a_session_and_group_of_its_own():
    async with open_bundle() as bundle:
        process = await start_ready(bundle, CLEANS_UP_ON_SIGTERM)
        assert os.getsid(process.pid) == process.pid
        assert os.getpgid(process.pid) == process.pid
        await bundle.shutdown(grace=10)
    assert process.returncode == 0


async def test_start_new_session_false_keeps_the_callers_group():
    async with open_bundle() as bundle:
        process = await start_ready(
            bundle, CLEANS_UP_ON_SIGTERM, start_new_session=False
        )
        assert os.getpgid(process.pid) == os.getpgid(0)
        report = await bundle.shutdown(grace=10)
    # Only the process itself was signalled, not the group it shares.
    assert process.returncode == 0
    assert report.children[0].notes == (
        f"process {process.pid} (python): got SIGTERM on STOP; exited with status 0",
    )


@pytest.mark.parametrize(
    ("deaf", "grace", "output", "ending"),
    [
        # The grandchild gets SIGTERM on STOP too, and cleans up.
        (False, 10, b"grandchild: got SIGTERM\n", "ended by SIGTERM"),
        # Both ignore SIGTERM (real time: the grace runs out), and SIGKILL
        # ends both; else the grandchild would hold the pipe for 60 s.
        (True, 0.5, b"", "got SIGKILL at the hard cancel; ended by SIGKILL"),
    ],
)
async def test_the_grandchildren_of_a_shell_get_the_signals_too(
    deaf, grace, output, ending
):
    async with open_bundle() as bundle:
        process = await bundle.start(
            functools.partial(run_process, stdout=subprocess.PIPE),
            shell_with_grandchild(deaf=deaf),
        )
        await read_line(process.stdout)  # the grandchild's pid: it is ready
        report = await bundle.shutdown(grace=grace)
        assert await read_to_end(process.stdout) == output
    assert report.children[0].notes == (
        f"process {process.pid} (sh): got SIGTERM on STOP; {ending}",
    )


@pytest.mark.skipif(sys.version_info < (3, 11), reason="process_group is new in 3.11")
async def test_a_group_of_its_own_without_a_session_is_signalled_as_a_whole():
    async with open_bundle() as bundle:
        process = await bundle.start(
            functools.partial(
                run_process,
                stdout=subprocess.PIPE,
                start_new_session=False,
                process_group=0,
            ),
            shell_with_grandchild(),
        )
        await read_line(process.stdout)
        assert os.getpgid(process.pid) == process.pid != os.getsid(process.pid)
        await bundle.shutdown(grace=10)
        assert await read_to_end(process.stdout) == b"grandchild: got SIGTERM\n"


# A program run by trio_graceful.run with a helper process, the script given
# as its first argument.
PROGRAM_WITH_HELPER = """
import sys
import trio_graceful

async def main():
    await trio_graceful.run_process([sys.executable, "-c", sys.argv[1]])

sys.exit(trio_graceful.run(main, grace=30))
"""


async def test_ctrl_c_reaches_the_program_and_the_helper_gets_stop():
    # Like a terminal: the program leads the foreground process group, and
    # Ctrl+C sends SIGINT to the whole group.
    program = await trio.lowlevel.open_process(
        # The helper would die of the SIGINT at once, if it got it.
        [*python(PROGRAM_WITH_HELPER), CLEANS_UP_ON_SIGTERM],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert await read_line(program.stdout) == b"ready"
        os.killpg(program.pid, signal.SIGINT)
        assert await read_to_end(program.stdout) == b"cleaning up\n"
        stderr = await read_to_end(program.stderr)
        with trio.fail_after(30):
            await program.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(program.pid, signal.SIGKILL)  # only if the test failed
    assert program.returncode == 130, stderr.decode()
    assert b"Traceback" not in stderr


# -- bad arguments and misuse --------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"stop_signal": "TERM"},
            TypeError,
            r"^stop_signal must be a signal number, not 'TERM'$",
        ),
        (
            {"stop_signal": True},
            TypeError,
            r"^stop_signal must be a signal number, not True$",
        ),
        (
            {"stop_signal": 0},
            ValueError,
            r"^stop_signal must be a valid signal number, not 0$",
        ),
        (
            {"stdin": subprocess.PIPE},
            ValueError,
            r"^stdin=subprocess.PIPE needs bundle.start\(run_process, \.\.\.\), "
            r"which returns the Process and its pipes$",
        ),
        (
            {"stdout": subprocess.PIPE},
            ValueError,
            r"^stdout=subprocess.PIPE needs bundle.start\(run_process, \.\.\.\), "
            r"which returns the Process and its pipes$",
        ),
        (
            {"stderr": subprocess.PIPE},
            ValueError,
            r"^stderr=subprocess.PIPE needs bundle.start\(run_process, \.\.\.\), "
            r"which returns the Process and its pipes$",
        ),
        ({"bundle": 5}, TypeError, r"^bundle must be a Bundle or None, not 5$"),
        ({"check": 6}, TypeError, r"^check must be True or False, not 6$"),
        (
            {"capture_stdout": "yes"},
            TypeError,
            r"^capture_stdout must be True or False, not 'yes'$",
        ),
        (
            {"capture_stderr": None},
            TypeError,
            r"^capture_stderr must be True or False, not None$",
        ),
        (
            {"start_new_session": 1},
            TypeError,
            r"^start_new_session must be True or False, not 1$",
        ),
        (
            {"stdin": "text"},
            TypeError,
            r"^stdin must be bytes, a file descriptor, a file or None, not 'text'$",
        ),
        (
            {"stdin": True},
            TypeError,
            r"^stdin must be bytes, a file descriptor, a file or None, not True$",
        ),
        (
            {"command": []},
            ValueError,
            r"^command must name a program to run, not \[\]$",
        ),
        (
            {"command": ""},
            ValueError,
            r"^command must name a program to run, not ''$",
        ),
        (
            {"command": [b""]},
            ValueError,
            r"^command must name a program to run, not \[b''\]$",
        ),
        (
            {"command": 5},
            TypeError,
            r"^command must be a string, bytes, a path or a sequence of them, "
            r"not 5$",
        ),
        (
            {"command": ["ls", 5]},
            TypeError,
            r"^command must be a string, bytes, a path or a sequence of them, "
            r"not \['ls', 5\]$",
        ),
    ],
)
async def test_bad_arguments_raise_before_anything_starts(kwargs, error, message):
    async def child() -> None:
        options = dict(kwargs)
        command = options.pop("command", ["/nonexistent/program"])
        with pytest.raises(error, match=message):
            await run_process(command, **options)

    async with open_bundle() as bundle:
        bundle.start_soon(child)


async def test_bundle_may_be_given_explicitly():
    results: list[int] = []

    async def child() -> None:
        completed = await run_process(python("pass"), bundle=bundle)
        results.append(completed.returncode)

    async with open_bundle() as bundle:
        bundle.start_soon(child)
    assert results == [0]
