"""Workers that end unexpectedly, scale changes, a stop during the startup and
the second signal.

Real processes, signals and sockets. Every wait is for a log line; the
bounds are only guards against a hang.
"""

from __future__ import annotations

import os
import re
import signal
import sys

import pytest
import trio

from tests.support.processes import PATIENCE
from tests.support.workers import (
    APP,
    SUPPORT,
    asgi_command,
    get_status,
    open_supervisor,
    run_load,
)

pytestmark = pytest.mark.realtime


async def test_a_sigkilled_worker_is_replaced_and_the_other_serves_on():
    command = asgi_command(
        *("--bind", "127.0.0.1:0", "--workers", "2", "--health-port", "0")
    )
    async with open_supervisor(command, workers=2) as supervisor:
        pids = supervisor.worker_pids()
        [health] = await supervisor.wait_for(r"health endpoint on port (\d+)")
        assert await get_status(int(health[1]), "/readyz") == 200
        async with run_load(supervisor.port, 12) as load:
            await load.wait_answered(40)
            load.ignore_pids.add(pids[1])
            load.excuse_unknown = True  # broken before its first answer
            os.kill(pids[1], signal.SIGKILL)
            await supervisor.wait_for(
                rf"worker 1 \(pid {pids[1]}, generation 0\) ended unexpectedly: "
                rf"it was ended by SIGKILL; its last status: .*; replacing it$"
            )
            await supervisor.wait_for(r"worker 3 \(pid \d+, generation 0\) ready")
            # Degraded, never unready, while one worker of two was ready.
            await supervisor.wait_for(r"ready -> degraded \(1 of 2 workers ready\)")
            await supervisor.wait_for(r"degraded -> ready \(2 workers ready\)")
            assert await get_status(int(health[1]), "/readyz") == 200
            await load.wait_answered(40)
        supervisor.signal(signal.SIGTERM)
        assert await supervisor.exit_status() == 0
    # No connection was refused, and the other worker lost nothing.
    assert load.tally.failures() == dict.fromkeys(load.tally.failures(), 0), (
        load.tally.problems
    )
    assert load.tally.pids <= set(supervisor.worker_pids().values())


async def test_a_crash_loop_reaches_the_restart_intensity_and_stops_the_service():
    command = [
        sys.executable,
        "-m",
        "tests.support.workers_program",
        "--workers",
        "2",
        "--max-restarts",
        "3",
        # Far longer than any test: every crash counts, however slow.
        "--restart-window",
        "3600",
        "--",
        sys.executable,
        str(SUPPORT / "workers_crashing.py"),
    ]
    async with open_supervisor(command, workers=0, ready=False) as supervisor:
        assert await supervisor.exit_status() == 1
    [line] = supervisor.lines_matching(r"^trio_graceful.workers: workers ended")
    assert re.search(
        r"workers ended unexpectedly 4 times within 3600 s \(at most 3 allowed\); "
        r"the last was worker \d \(pid \d+, generation 0\), which exited with "
        r"status 3; its last status: failing on purpose; stopping the service$",
        line,
    ), line
    assert len(supervisor.lines_matching("ended unexpectedly: it exited")) == 3
    assert supervisor.lines_matching("exiting with status 1")


async def test_sigttin_adds_a_worker_and_sigttou_removes_one_drained():
    command = asgi_command("--bind", "127.0.0.1:0")
    async with open_supervisor(command, workers=1) as supervisor:
        async with run_load(supervisor.port, 6) as load:
            await load.wait_answered(10)
            supervisor.signal(signal.SIGTTIN)
            await supervisor.wait_for(r"added worker 2: 2 workers now")
            await load.wait_answered(10)
            supervisor.signal(signal.SIGTTOU)
            await supervisor.wait_for(r"removing a worker: 1 worker now")
            await supervisor.wait_for(r"worker 1 \(pid \d+, generation 0\) exited")
            await load.wait_answered(10)
            supervisor.signal(signal.SIGTTOU)
            await supervisor.wait_for(r"not removing the last worker")
            await load.wait_answered(10)
        supervisor.signal(signal.SIGTERM)
        assert await supervisor.exit_status() == 0
    assert load.tally.failures() == dict.fromkeys(load.tally.failures(), 0), (
        load.tally.problems
    )
    assert supervisor.lines_matching(r"worker 1 .* stopping \(removed\)")
    assert not supervisor.lines_matching("ended unexpectedly")
    # A worker added is counted once ready: the service was never degraded.
    assert not supervisor.lines_matching("degraded")


async def test_a_stop_between_the_workers_readiness_and_the_services_drains_them():
    # The workers accept already; the service is held before it is ready
    # itself (as it is for a moment in every start).
    worker = [sys.executable, "-m", "trio_graceful.asgi._workermain", APP]
    command = [
        *(sys.executable, "-m", "tests.support.workers_program"),
        *("--workers", "2", "--hold", "--"),
        *(*worker, "--app-dir", str(SUPPORT), "--grace", "60"),
    ]
    async with open_supervisor(command, workers=2, ready=False) as supervisor:
        await supervisor.wait_for("holding: the workers are ready, the service is not")
        pids = supervisor.worker_pids()
        received = b""
        async with await trio.open_tcp_stream("127.0.0.1", supervisor.port) as stream:
            # Pipelined: once the first is answered, its worker has received
            # the second too.
            await stream.send_all(
                b"GET /work?ms=0&id=1 HTTP/1.1\r\nHost: x\r\n\r\n"
                b"GET /work?ms=1000&id=2 HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            with trio.fail_after(PATIENCE):
                while b'{"id":"1"}' not in received:
                    received += await stream.receive_some()
                supervisor.signal(signal.SIGTERM)
                while chunk := await stream.receive_some():
                    received += chunk
        assert await supervisor.exit_status() == 0
    # Both workers got STOP, and the request in flight was answered, the
    # last on its connection; nothing was killed.
    assert len(supervisor.lines_matching(r"\) stopping \(the service stops\)$")) == 2
    assert received.count(b"HTTP/1.1 200 ") == 2, received
    assert received.endswith(b'{"id":"2"}'), received
    assert b"connection: close" in received.lower(), received
    assert not supervisor.lines_matching("SIGKILL")
    assert not supervisor.lines_matching("ended unexpectedly")
    for number, pid in pids.items():
        [_] = supervisor.lines_matching(
            rf"worker {number} \(pid {pid}, generation 0\) exited with status 0$"
        )


async def test_a_second_signal_kills_the_draining_workers_at_once():
    command = asgi_command("--bind", "127.0.0.1:0", "--workers", "2", "--grace", "60")
    async with open_supervisor(command, workers=2) as supervisor:
        pids = supervisor.worker_pids()
        stream = await trio.open_tcp_stream("127.0.0.1", supervisor.port)
        async with stream:
            # A request that outlasts any test keeps its worker draining.
            await stream.send_all(
                b"GET /work?ms=600000&id=1 HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            supervisor.signal(signal.SIGTERM)
            await supervisor.wait_for(r"stopping \(the service stops\)", 2)
            [draining] = await supervisor.wait_for(
                r"\[(\d+)\] trio_graceful.asgi INFO: STOP: draining 1 connection"
            )
            # The log names the worker still draining.
            [line] = await supervisor.wait_for(r"still draining: (.*)$")
            assert f"(pid {draining[1]}, generation 0)" in line[1]
            started = trio.current_time()
            supervisor.signal(signal.SIGTERM)
            status = await supervisor.exit_status()
            took = trio.current_time() - started
    assert status == 128 + signal.SIGTERM
    # The draining worker got SIGKILL (the idle one may have exited already).
    assert supervisor.lines_matching(r"\) was ended by SIGKILL")
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
    print(f"the second signal ended everything in {took:.3f} s")
