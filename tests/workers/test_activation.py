"""The service manager's side: socket activation and ``Type=notify-reload``.

Real processes, signals and sockets. Every wait is for a log line or a
message; the bounds are only guards against a hang.
"""

from __future__ import annotations

import signal
import socket
import sys
import time
from pathlib import Path

import pytest
import trio

from tests.support.processes import PATIENCE
from tests.support.workers import SUPPORT, asgi_command, open_supervisor, run_load

pytestmark = pytest.mark.realtime


def activated(listening: socket.socket, *options: str) -> list[str]:
    """The command line of the service, started as socket activation does."""
    launcher = [sys.executable, str(SUPPORT / "socket_activation.py")]
    return [*launcher, str(listening.fileno()), *asgi_command(*options)]


async def test_a_full_restart_with_the_socket_kept_refuses_no_connection():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(socket.SOMAXCONN)
        port = listening.getsockname()[1]
        fds = [listening.fileno()]
        command = activated(listening, "--workers", "2")
        async with run_load(port, 12) as load:
            for restart in range(2):
                async with open_supervisor(command, workers=2, pass_fds=fds) as one:
                    assert one.port == port
                    await load.wait_answered(40)
                    one.signal(signal.SIGTERM)
                    assert await one.exit_status() == 0, restart
            # Between two services, connections wait in the queue.
            async with open_supervisor(command, workers=2, pass_fds=fds) as last:
                await load.wait_answered(40)
                load.stop()
                last.signal(signal.SIGTERM)
                assert await last.exit_status() == 0
    assert load.tally.failures() == dict.fromkeys(load.tally.failures(), 0), (
        load.tally.problems
    )


async def test_a_reload_tells_the_service_manager_reloading_then_ready(
    tmp_path: Path,
):
    path = str(tmp_path / "notify")
    with trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        await manager.bind(path)

        async def message() -> dict[str, str]:
            with trio.fail_after(PATIENCE):
                datagram = await manager.recv(4096)
            return dict(line.split("=", 1) for line in datagram.decode().splitlines())

        command = asgi_command("--bind", "127.0.0.1:0", "--workers", "2")
        env = {"NOTIFY_SOCKET": path}
        async with open_supervisor(
            command, workers=2, ready=False, env=env
        ) as supervisor:
            while "READY" not in (ready := await message()):
                pass
            assert ready["READY"] == "1"
            before = time.monotonic()
            supervisor.signal(signal.SIGHUP)
            while "RELOADING" not in (reloading := await message()):
                pass
            after = time.monotonic()
            assert reloading["RELOADING"] == "1"
            # sd_notify's MONOTONIC_USEC: CLOCK_MONOTONIC, in microseconds.
            usec = int(reloading["MONOTONIC_USEC"])
            assert before * 1e6 - 1 <= usec <= after * 1e6 + 1
            while "READY" not in (done := await message()):
                assert "RELOADING" not in done
            assert done == {"READY": "1", "STATUS": "reload 1 done"}
            await supervisor.wait_for("reload 1 done")
            supervisor.signal(signal.SIGTERM)
            while "STOPPING" not in await message():
                pass
            assert await supervisor.exit_status() == 0
