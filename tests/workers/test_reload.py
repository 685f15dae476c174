"""Reloads of ``python -m trio_graceful.asgi``: under load, one worker, failures.

Real processes, signals and sockets. Every wait is for a log line; the
bounds are only guards against a hang.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from wsproto.events import TextMessage

from tests.support.websocket_clients import open_wire_client
from tests.support.workers import asgi_command, open_supervisor, run_load

pytestmark = pytest.mark.realtime


async def test_reloads_under_load_lose_no_request():
    command = asgi_command("--bind", "127.0.0.1:0", "--workers", "2")
    async with open_supervisor(command, workers=2) as supervisor:
        async with run_load(supervisor.port, 16) as load:
            await load.wait_answered(50)
            for reload in (1, 2):
                supervisor.signal(signal.SIGHUP)
                await supervisor.wait_for(rf"reload {reload} done")
                await load.wait_answered(50)
        supervisor.signal(signal.SIGTERM)
        assert await supervisor.exit_status() == 0
    assert load.tally.failures() == dict.fromkeys(load.tally.failures(), 0), (
        load.tally.problems
    )
    # Only workers answered, and after the second reload, only its new ones.
    started = supervisor.worker_pids("started")
    assert load.tally.pids <= set(started.values())
    assert load.tally.pids & {started[5], started[6]}
    for generation in (0, 1, 2):
        assert len(supervisor.lines_matching(rf"generation {generation}\) ready")) == 2


async def test_a_one_worker_reload_has_two_workers_for_a_moment():
    command = asgi_command("--bind", "127.0.0.1:0")
    async with open_supervisor(command, workers=1) as supervisor:
        async with run_load(supervisor.port, 8) as load:
            await load.wait_answered(20)
            supervisor.signal(signal.SIGHUP)
            await supervisor.wait_for("reload 1 done")
            await load.wait_answered(20)
        supervisor.signal(signal.SIGINT)
        assert await supervisor.exit_status() == 0
    assert load.tally.failures() == dict.fromkeys(load.tally.failures(), 0), (
        load.tally.problems
    )
    # The new worker was ready before the old one was told to stop.
    order = supervisor.lines_matching(
        r"worker 2 \(pid .*\) ready$|worker 1 \(pid .*\) stopping"
    )
    assert "ready" in order[0]
    assert "stopping (replaced by worker 2)" in order[1]


async def test_a_new_worker_that_fails_at_startup_leaves_the_old_one(tmp_path: Path):
    mode = tmp_path / "mode"
    command = asgi_command("--bind", "127.0.0.1:0")
    env = {"WORKERS_APP_MODE": str(mode)}
    async with open_supervisor(command, workers=1, env=env) as supervisor:
        [old] = supervisor.worker_pids().values()
        async with run_load(supervisor.port, 4) as load:
            await load.wait_answered(10)
            mode.write_text("fail")
            supervisor.signal(signal.SIGHUP)
            [failed] = await supervisor.wait_for(r"reload 1 failed: (.*)")
            assert failed[1] == (
                f"worker 2 (pid {supervisor.worker_pids('started')[2]}, "
                f"generation 1) exited with status 1; the old workers go on serving"
            )
            await load.wait_answered(10)
            mode.write_text("")
            supervisor.signal(signal.SIGHUP)
            await supervisor.wait_for("reload 2 done")
            await load.wait_answered(10)
        supervisor.signal(signal.SIGTERM)
        assert await supervisor.exit_status() == 0
    assert load.tally.failures() == dict.fromkeys(load.tally.failures(), 0), (
        load.tally.problems
    )
    assert load.tally.pids == {old, supervisor.worker_pids()[3]}
    # The failed worker was stopped, not replaced as a crash.
    assert not supervisor.lines_matching("ended unexpectedly")


async def test_a_new_worker_never_ready_is_stopped_and_the_old_one_serves_on(
    tmp_path: Path,
):
    mode = tmp_path / "mode"
    # Ten times what a worker takes to start on an idle machine: the time
    # the never-ready worker is given.
    command = asgi_command("--bind", "127.0.0.1:0", "--ready-timeout", "15")
    env = {"WORKERS_APP_MODE": str(mode)}
    async with open_supervisor(command, workers=1, env=env) as supervisor:
        [old] = supervisor.worker_pids().values()
        async with run_load(supervisor.port, 4) as load:
            await load.wait_answered(10)
            mode.write_text("hang")
            supervisor.signal(signal.SIGHUP)
            [failed] = await supervisor.wait_for(r"reload 1 failed: (.*)")
            assert failed[1] == (
                f"worker 2 (pid {supervisor.worker_pids('started')[2]}, "
                f"generation 1) was not ready within 15 s; the old workers go on "
                f"serving"
            )
            await load.wait_answered(10)
        supervisor.signal(signal.SIGTERM)
        assert await supervisor.exit_status() == 0
    assert load.tally.failures() == dict.fromkeys(load.tally.failures(), 0), (
        load.tally.problems
    )
    assert load.tally.pids == {old}
    assert not supervisor.lines_matching("ended unexpectedly")


async def test_sighups_during_a_reload_make_one_more_reload():
    command = asgi_command("--bind", "127.0.0.1:0")
    async with open_supervisor(command, workers=1) as supervisor:
        supervisor.signal(signal.SIGHUP)
        await supervisor.wait_for(r"reload 1 started: replacing 1 worker")
        for _ in range(3):
            supervisor.signal(signal.SIGHUP)
        await supervisor.wait_for("reload 1 done")
        await supervisor.wait_for("reload 2 done")
        supervisor.signal(signal.SIGTERM)
        assert await supervisor.exit_status() == 0
    assert not supervisor.lines_matching("reload 3")
    # Each reload replaced the one worker: three generations, one at a time.
    for generation in (0, 1, 2):
        assert len(supervisor.lines_matching(rf"generation {generation}\) ready")) == 1


async def test_a_websocket_hears_1001_at_a_reload_and_the_new_worker_serves_the_next():
    command = asgi_command("--bind", "127.0.0.1:0")
    async with open_supervisor(command, workers=1) as supervisor:
        [old] = supervisor.worker_pids().values()
        async with open_wire_client(supervisor.port, target="/echo") as websocket:
            await websocket.send_text("before")
            assert await websocket.receive() == TextMessage(f"before {old}")
            supervisor.signal(signal.SIGHUP)
            assert await websocket.receive_close() == (1001, "")
            await websocket.send_close(1001)
            await websocket.receive_eof()
        await supervisor.wait_for("reload 1 done")
        [new] = set(supervisor.worker_pids().values()) - {old}
        async with open_wire_client(supervisor.port, target="/echo") as websocket:
            await websocket.send_text("after")
            assert await websocket.receive() == TextMessage(f"after {new}")
            await websocket.send_close(1000)
            assert await websocket.receive_close() == (1000, "")
        supervisor.signal(signal.SIGTERM)
        assert await supervisor.exit_status() == 0
