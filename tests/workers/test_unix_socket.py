"""A ``unix:PATH`` socket of ``python -m trio_graceful.asgi``: its file, across runs.

Real processes, signals and sockets. Every wait is for a log line; the
bounds are only guards against a hang.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
import trio

from tests.support.processes import PATIENCE
from tests.support.workers import asgi_command, get_status, open_supervisor

pytestmark = pytest.mark.realtime


async def test_the_file_goes_at_exit_so_the_next_run_binds_the_same_path(
    tmp_path: Path,
):
    path = tmp_path / "service.sock"
    command = asgi_command("--bind", "127.0.0.1:0", "--bind", f"unix:{path}")
    for run in range(2):
        async with open_supervisor(command, workers=1) as supervisor:
            assert await get_status(str(path), "/work?ms=0&id=1") == 200
            supervisor.signal(signal.SIGTERM)
            assert await supervisor.exit_status() == 0, (run, supervisor.log())
        assert not path.exists()


async def test_a_file_left_by_a_killed_supervisor_is_replaced(tmp_path: Path):
    path = tmp_path / "service.sock"
    command = asgi_command("--bind", "127.0.0.1:0", "--bind", f"unix:{path}")
    async with open_supervisor(command, workers=1) as supervisor:
        supervisor.kill_everything()
        await supervisor.exit_status()
    assert path.is_socket()  # left behind: nobody listens on it
    async with open_supervisor(command, workers=1) as supervisor:
        assert await get_status(str(path), "/work?ms=0&id=1") == 200
        supervisor.signal(signal.SIGTERM)
        assert await supervisor.exit_status() == 0
    assert not path.exists()


async def test_a_path_another_service_listens_on_is_refused(tmp_path: Path):
    path = tmp_path / "service.sock"
    command = asgi_command("--bind", "127.0.0.1:0", "--bind", f"unix:{path}")
    async with open_supervisor(command, workers=1) as first:
        with trio.fail_after(PATIENCE):
            second = await trio.run_process(
                command, capture_stderr=True, check=False, stdout=subprocess.DEVNULL
            )
        assert second.returncode == 2
        assert second.stderr.decode().splitlines() == [
            f"python -m trio_graceful.asgi: [Errno 98] cannot listen on "
            f"unix:{path}: another process listens there"
        ]
        assert await get_status(str(path), "/work?ms=0&id=1") == 200
        first.signal(signal.SIGTERM)
        assert await first.exit_status() == 0
    assert not path.exists()
