"""A program's subprocesses when its service manager stops it, by kill mode.

systemd stops a unit by sending SIGTERM, and what gets it depends on
``KillMode=`` (systemd.kill(5)): with the default ``control-group`` every
process of the unit's control group gets it at once; with ``mixed`` only the
main process does, and the rest get SIGKILL once the main process has exited
(or at ``TimeoutStopSec=``). A program run by `trio_graceful.run` stops its
subprocesses itself: STOP sends SIGTERM to each, in the order of the
shutdown, within the grace. Here a program runs a "database" (a service,
stopped last) and a "worker" that needs it (a trio_graceful program itself,
which drains for a while after SIGTERM), and the tests play the service
manager with real signals.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.processes import LineReader, children_of, running, stat_of, wait_for

pytestmark = pytest.mark.realtime

# Tells who sent its SIGTERM, then exits.
DATABASE = """
    import os, signal
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    print(f"database ready {os.getpid()}", flush=True)
    info = signal.sigwaitinfo({signal.SIGTERM})
    print(f"database SIGTERM from {info.si_pid}", flush=True)
    print("database exit", flush=True)
"""

# Drains for argv[1] seconds after STOP: the jobs in hand.
WORKER = """
    import logging, os, sys
    import trio
    import trio_graceful

    logging.basicConfig(format="worker: %(message)s")

    async def main(*, task_status=trio.TASK_STATUS_IGNORED):
        _, inbox = trio_graceful.current_runner().root.open_inbox()
        print(f"worker ready {os.getpid()}", flush=True)
        task_status.started()
        await inbox.receive()  # STOP
        print("worker draining", flush=True)
        await trio.sleep(float(sys.argv[1]))
        print("worker drained", flush=True)

    sys.exit(trio_graceful.run(main, grace=30))
"""

PROGRAM = """
    import logging, math, sys
    import trio
    import trio_graceful

    logging.basicConfig(format="program: %(message)s")
    DATABASE, WORKER, DRAIN = sys.argv[1:]

    async def database(inbox, *, task_status=trio.TASK_STATUS_IGNORED):
        async with trio_graceful.open_bundle(name="database") as bundle:
            await bundle.start(trio_graceful.run_process, [sys.executable, DATABASE])
            task_status.started()
            await inbox.receive()  # STOP, once main has ended
            await bundle.shutdown(math.inf)  # SIGTERM; the run's deadline bounds it

    async def main(*, task_status=trio.TASK_STATUS_IGNORED):
        await trio_graceful.current_runner().start_service(database, name="database")
        task_status.started()
        await trio_graceful.run_process([sys.executable, WORKER, DRAIN])

    sys.exit(trio_graceful.run(main, grace=30))
"""


def write(tmp_path: Path, name: str, source: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return str(path)


def program_argv(tmp_path: Path, drain: float) -> list[str]:
    return [
        sys.executable,
        write(tmp_path, "program", PROGRAM),
        write(tmp_path, "database", DATABASE),
        write(tmp_path, "worker", WORKER),
        str(drain),
    ]


def ready_pids(output: LineReader) -> dict[str, int]:
    """Read the two "<name> ready <pid>" lines, which come in either order."""
    pids: dict[str, int] = {}
    for _ in range(2):
        name, word, pid = output.next().split()
        assert word == "ready"
        pids[name] = int(pid)
    assert set(pids) == {"database", "worker"}
    return pids


def test_mixed_sigterm_to_the_main_process_stops_the_children_in_order(tmp_path):
    # KillMode=mixed: SIGTERM to the main process only.
    with running(program_argv(tmp_path, drain=0.2)) as process:
        assert process.stdout is not None
        assert process.stderr is not None
        output = LineReader(process.stdout)
        pids = ready_pids(output)
        # The unit's control group: the program and its two children.
        assert children_of(process.pid) == sorted(pids.values())

        began = time.monotonic()
        os.kill(process.pid, signal.SIGTERM)
        # The worker drains while the database still runs; the database gets
        # SIGTERM from the program, and only once the worker has ended.
        assert output.rest() == [
            "worker draining",
            "worker drained",
            f"database SIGTERM from {process.pid}",
            "database exit",
        ]
        assert process.wait(timeout=60) == 0
        assert time.monotonic() - began < 30  # within the program's grace
        assert process.stderr.read().decode().splitlines() == [
            "program: SIGTERM: shutting down (grace 30 s)",
            "worker: SIGTERM: shutting down (grace 30 s)",
        ]
    # Nothing is left for the service manager's SIGKILL.
    assert [stat_of(pid) for pid in pids.values()] == [None, None]


def test_control_group_sigterm_to_every_process_breaks_the_order(tmp_path):
    # KillMode=control-group: SIGTERM to every process of the unit at once, in
    # no particular order. Here the worker gets it first, then the database,
    # then the program.
    manager = os.getpid()
    with running(program_argv(tmp_path, drain=600)) as process:
        assert process.stdout is not None
        assert process.stderr is not None
        output = LineReader(process.stdout)
        pids = ready_pids(output)

        os.kill(pids["worker"], signal.SIGTERM)
        assert output.next() == "worker draining"
        # The database goes while the worker, which needs it, still drains.
        os.kill(pids["database"], signal.SIGTERM)
        assert output.next() == f"database SIGTERM from {manager}"
        assert output.next() == "database exit"
        wait_for(lambda: stat_of(pids["database"]) is None, "the database's end")

        # The program's STOP is the worker's second SIGTERM: its drain is cut
        # short (exit status 143), which the program takes for a failure.
        os.kill(process.pid, signal.SIGTERM)
        assert output.rest() == []
        assert process.wait(timeout=60) == 1
        errors = process.stderr.read().decode()
    lines = errors.splitlines()
    assert lines[:4] == [
        "worker: SIGTERM: shutting down (grace 30 s)",
        "program: SIGTERM: shutting down (grace 30 s)",
        "worker: forcing: SIGTERM again",
        "program: main raised",
    ]
    assert lines[-1].endswith("worker.py', '600']' returned non-zero exit status 143.")
