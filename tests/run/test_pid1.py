"""A program as PID 1 of a PID namespace, as in a container without an init.

The kernel treats the first process of a PID namespace (a container's
``ENTRYPOINT``) apart: a signal reaches it only if it installed a handler for
that signal (the default action, to die, does not apply; SIGKILL from outside
is the exception), and every process orphaned in the namespace becomes its
child, so it must reap them or their zombies stay. These tests run real
programs as PID 1 with ``unshare --pid --fork --mount-proc`` (which needs
root) and show both rules: `trio_graceful.run` installs its handlers, so
SIGTERM works; it reaps only its own children, so an orphan's zombie stays,
unless an init such as tini runs as PID 1 in its place.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.processes import LineReader, children_of, running, stat_of, wait_for
from trio_graceful._run._program._program import PID_1_WARNING

pytestmark = pytest.mark.realtime

UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]


@functools.cache
def _refusal() -> str | None:
    """Why this machine cannot start a PID namespace; None if it can."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    trial = subprocess.run([*UNSHARE, "true"], capture_output=True, check=False)
    if trial.returncode != 0:
        why = trial.stderr.decode().strip()
        return f"unshare --pid is not permitted here (it needs root): {why}"
    return None


@pytest.fixture
def namespace() -> list[str]:
    """The command prefix that runs a program as PID 1 of a new PID namespace."""
    refusal = _refusal()
    if refusal is not None:
        pytest.skip(refusal)
    return UNSHARE


def script(tmp_path: Path, source: str) -> str:
    path = tmp_path / "program.py"
    path.write_text(textwrap.dedent(source))
    return str(path)


def runs_script(pid: int, path: str) -> bool:
    return path in Path(f"/proc/{pid}/cmdline").read_text().split("\0")


def only_child(pid: int) -> int:
    (child,) = children_of(pid)
    return child


# A program without a handler for SIGTERM; it says it is alive once it reads
# a line. By then a SIGTERM sent before that line would have killed it.
PLAIN = """
    import os, sys
    print(f"pid {os.getpid()}", flush=True)
    sys.stdin.readline()
    print("alive", flush=True)
"""


@pytest.mark.parametrize("as_pid_1", [False, True])
def test_sigterm_without_a_handler_kills_a_process_but_not_pid_1(
    tmp_path, request, as_pid_1
):
    prefix = request.getfixturevalue("namespace") if as_pid_1 else []
    argv = [*prefix, sys.executable, script(tmp_path, PLAIN)]
    with running(argv, stdin=subprocess.PIPE) as process:
        assert process.stdout is not None
        assert process.stdin is not None
        first = process.stdout.readline().decode()
        assert first == f"pid {1 if as_pid_1 else process.pid}\n"
        program = only_child(process.pid) if as_pid_1 else process.pid
        os.kill(program, signal.SIGTERM)  # from outside, as a container runtime does
        # kill() has queued the signal, or dropped it; a queued SIGTERM kills
        # the process before it can run again.
        with contextlib.suppress(BrokenPipeError):
            process.stdin.write(b"go on\n")
            process.stdin.close()
        output = process.stdout.read()
        assert process.wait(timeout=60) == (0 if as_pid_1 else -signal.SIGTERM)
    assert output == (b"alive\n" if as_pid_1 else b"")


# A program that, like a shell running "worker &", leaves an orphan behind:
# sh starts sleep in the background and exits, so sleep's parent is gone.
GRACEFUL = """
    import os, sys
    import trio
    import trio_graceful

    async def main(*, task_status=trio.TASK_STATUS_IGNORED):
        _, inbox = trio_graceful.current_runner().root.open_inbox()
        await trio_graceful.run_process(
            ["sh", "-c", "sleep 600 </dev/null >/dev/null 2>&1 &"]
        )
        print(f"pid {os.getpid()}", flush=True)
        task_status.started()
        await inbox.receive()  # STOP
        print("stopped", flush=True)

    sys.exit(trio_graceful.run(main))
"""


def stop_and_check(
    process: subprocess.Popen[bytes], output: LineReader, pid: int, *, pid_1: bool
) -> None:
    """Send SIGTERM to ``pid`` and check that the program shut down gracefully."""
    os.kill(pid, signal.SIGTERM)  # from outside, as a container runtime does
    assert output.rest() == ["stopped"]
    # unshare (and tini) exit with the program's status.
    assert process.wait(timeout=60) == 0
    assert process.stderr is not None
    warning = [PID_1_WARNING] if pid_1 else []
    assert process.stderr.read().decode().splitlines() == [
        *warning,
        "SIGTERM: shutting down (grace 10 s)",
    ]


def test_as_pid_1_the_runner_shuts_down_on_sigterm_and_leaves_orphans_as_zombies(
    tmp_path, namespace
):
    with running([*namespace, sys.executable, script(tmp_path, GRACEFUL)]) as process:
        assert process.stdout is not None
        output = LineReader(process.stdout)
        assert output.next() == "pid 1"
        program = only_child(process.pid)
        # The orphan was handed to PID 1 of its namespace: the program.
        orphan = only_child(program)

        os.kill(orphan, signal.SIGTERM)  # the orphan ends...
        wait_for(lambda: stat_of(orphan) == ("Z", program), "the orphan to end")
        # ... and stays a zombie: the runner waits for its own children only.
        assert children_of(program) == [orphan]

        stop_and_check(process, output, program, pid_1=True)


def test_under_tini_the_orphans_are_reaped_and_sigterm_is_passed_on(
    tmp_path, namespace
):
    tini = shutil.which("tini")
    if tini is None:
        pytest.skip("tini is not installed (apt-get install tini)")
    program_path = script(tmp_path, GRACEFUL)
    argv = [*namespace, tini, "--", sys.executable, program_path]
    with running(argv) as process:
        assert process.stdout is not None
        output = LineReader(process.stdout)
        assert output.next() == "pid 2"  # tini is PID 1
        init = only_child(process.pid)
        # The orphan went to tini (it may not run sleep yet: a fork of sh).
        (program,) = [p for p in children_of(init) if runs_script(p, program_path)]
        (orphan,) = set(children_of(init)) - {program}
        assert children_of(program) == []

        os.kill(orphan, signal.SIGTERM)
        wait_for(lambda: stat_of(orphan) is None, "tini to reap the orphan")

        stop_and_check(process, output, init, pid_1=False)  # tini passes it on
