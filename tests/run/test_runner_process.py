"""trio_graceful.run in real subprocesses: zero and huge bounds, inherited
ignored signals, and what the emergency report shows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.realtime


def write(tmp_path: Path, source: str) -> Path:
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(source))
    return script


def popen(
    argv: list[str], env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


RETURNS_AT_ONCE = """
    import sys
    import trio_graceful

    async def main():
        pass

    sys.exit(trio_graceful.run(main, grace=float(sys.argv[1]),
                               unwind_budget=float(sys.argv[2])))
"""


def test_zero_grace_and_budget_with_nothing_to_unwind_exit_0_every_time(tmp_path):
    # The watchdog's deadline has passed the moment the shutdown begins; a
    # program that is busy finishing it is not killed for that.
    script = write(tmp_path, RETURNS_AT_ONCE)
    outcomes: list[tuple[int, str]] = []
    for _ in range(3):
        # Ten at once, on a machine kept busy by them.
        processes = [popen([sys.executable, str(script), "0", "0"]) for _ in range(10)]
        for process in processes:
            _, stderr = process.communicate(timeout=60)
            # The whole report of any that ended otherwise, to say why.
            report = stderr.decode() if process.returncode else ""
            outcomes.append((process.returncode, report))
    assert outcomes == [(0, "")] * 30


DRAINS = """
    import sys
    import trio
    import trio_graceful

    async def main():
        runner = trio_graceful.current_runner()
        _, inbox = runner.root.open_inbox()
        runner.request_shutdown()
        await inbox.receive()  # STOP
        await trio.sleep(0.3)  # the watchdog waits meanwhile

    sys.exit(trio_graceful.run(main, grace=float(sys.argv[1]),
                               unwind_budget=float(sys.argv[1])))
"""


@pytest.mark.parametrize("grace", ["1e10", "1e300", "inf"])
def test_huge_and_infinite_graces_leave_the_watchdog_working(tmp_path, grace):
    script = write(tmp_path, DRAINS)
    process = popen([sys.executable, str(script), grace])
    _, stderr = process.communicate(timeout=60)
    assert (process.returncode, stderr) == (0, b"")


IGNORES = """
    import sys
    import trio_graceful

    async def main():
        _, inbox = trio_graceful.current_runner().root.open_inbox()
        print("ready", flush=True)
        await inbox.receive()  # STOP

    sys.exit(trio_graceful.run(main))
"""


def test_an_inherited_ignored_sigint_stays_ignored(tmp_path):
    script = write(tmp_path, IGNORES)
    # As a non-interactive shell starts "prog &".
    process = popen(["sh", "-c", f'trap "" INT; exec "{sys.executable}" "{script}"'])
    assert process.stdout is not None
    assert process.stdout.readline() == b"ready\n"
    # Both are pending before the program runs again; SIGINT (2) would be
    # delivered first if it were not ignored.
    os.kill(process.pid, signal.SIGINT)
    os.kill(process.pid, signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0
    assert stderr.decode() == (
        "SIGINT was ignored by the parent process (as for 'prog &' in a "
        "script): Ctrl+C will not stop this program, since the run leaves "
        "SIGINT ignored, as Python does; install a handler for it before "
        "run() to handle it\n"
        "SIGTERM: shutting down (grace 10 s)\n"
    )


def test_an_inherited_ignored_sigterm_is_said_and_stays_ignored(tmp_path):
    script = write(tmp_path, IGNORES)
    # A parent that ignores SIGTERM and execs the program, which inherits it.
    parent = (
        "import os, signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "os.execv(sys.executable, [sys.executable, sys.argv[1]])"
    )
    process = popen([sys.executable, "-c", parent, str(script)])
    assert process.stdout is not None
    assert process.stdout.readline() == b"ready\n"
    os.kill(process.pid, signal.SIGTERM)
    os.kill(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert stderr.decode() == (
        "SIGTERM was ignored by the parent process: SIGTERM will not stop "
        "this program, since the run leaves SIGTERM ignored, as Python does; "
        "install a handler for it before run() to handle it\n"
        "SIGINT: shutting down (grace 10 s)\n"
    )


STUCK = """
    import sys
    import trio
    import trio_graceful

    async def stuck():
        with trio.CancelScope(shield=True):
            await trio.sleep_forever()

    async def main():
        trio_graceful.current_runner().root.start_soon(stuck, name="stuck")

    sys.exit(trio_graceful.run(main, grace=0.1, unwind_budget=0.1, signals=()))
"""


def emergency_report(tmp_path: Path, env: dict[str, str]) -> list[str]:
    script = write(tmp_path, STUCK)
    process = popen([sys.executable, str(script)], env={**os.environ, **env})
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 137
    text = stderr.decode()
    return text.split("tasks still running:\n", 1)[1].splitlines()


def test_the_emergency_report_shows_the_programs_frames(tmp_path):
    lines = emergency_report(tmp_path, {})
    stuck = lines.index("    stuck")
    # The bundle's wrapper, the program's function, then trio's sleep.
    assert lines[stuck + 1 : stuck + 4] == [
        "        (1 frame in trio, trio_graceful)",
        f"        {tmp_path / 'program.py'}:8 in stuck",
        "        (1 frame in trio, trio_graceful)",
    ]
    # The Trio thread's stack ends in the program's own call of run().
    assert lines[-2:] == [
        "  (4 frames in trio, trio_graceful)",
        f'  File "{tmp_path / "program.py"}", line 13 in <module>',
    ]
    assert not [line for line in lines if "site-packages/trio/" in line]
    assert not [line for line in lines if "trio_graceful/_" in line]


def test_the_emergency_report_shows_the_internals_when_asked(tmp_path):
    lines = emergency_report(tmp_path, {"TRIO_GRACEFUL_SHOW_INTERNALS": "1"})
    stuck = lines.index("    stuck")
    assert lines[stuck + 1].endswith(" in _run_child")
    assert lines[stuck + 2] == f"        {tmp_path / 'program.py'}:8 in stuck"
    assert lines[stuck + 3].endswith("trio/_timeouts.py:71 in sleep_forever")
    assert not [line for line in lines if "in trio, trio_graceful)" in line]
