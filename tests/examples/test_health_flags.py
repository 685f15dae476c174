"""The examples' --health-port and --drain-delay, in real processes probed over HTTP.

The WebSocket server's delay is long (a minute) and ended by a second
signal, so that what it does during the delay is checked without a race
against its end; the jobs worker's delay is short and waited for, and only a
lower bound of its length is asserted. How long the server's delay lasts is
asserted by tests/bench/test_rolling_restart.py.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from tests.support.examples import EXAMPLES
from tests.support.websocket_clients import open_trio_websocket

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from _rolling import (  # noqa: E402
    HEALTH,
    LISTENING,
    Replica,
    http_get,
    probe,
    running,
    wait_ready,
)

pytestmark = pytest.mark.realtime

TIMEOUT = 60  # generous: a bound against hangs, not a measurement
WITHDRAWN = r"SIGTERM: not ready; serving [0-9.]+ s more \(drain delay\)"


@contextlib.asynccontextmanager
async def ready(script: str, *args: str) -> AsyncIterator[tuple[Replica, int]]:
    """Run an example; yield it and its health port once it says it is ready."""
    command = [sys.executable, str(EXAMPLES / script), *args, "--health-port", "0"]
    with trio.fail_after(TIMEOUT):
        async with running(script, command) as program:
            health = int((await program.wait_logged(HEALTH)).group(1))
            await wait_ready(health)  # as an orchestrator does: it probes
            assert await probe(health, "/livez") == 200
            yield program, health


async def test_websocket_server_serves_during_its_drain_delay() -> None:
    async with ready(
        "websocket_close_server.py",
        *("--port", "0", "--drain-delay", "60", "--log-level", "INFO"),
    ) as (server, health):
        port = int((await server.wait_logged(LISTENING)).group(1))
        server.process.send_signal(signal.SIGTERM)
        await server.wait_logged(WITHDRAWN)
        assert await probe(health, "/readyz") == 503
        assert await probe(health, "/livez") == 200
        response = await http_get(health, "/statusz")
        assert response is not None
        status, body = response
        assert status == 200
        report = json.loads(body)
        assert report["state"] == "withdrawn"
        assert report["ready"] is False
        assert 0 < report["drain_delay_left"] <= 60
        # Not ready, yet still accepting and answering.
        async with open_trio_websocket(port) as ws:
            await ws.send_message(json.dumps({"id": 7, "work_ms": 0}))
            assert json.loads(await ws.get_message()) == {"id": 7}
        assert not any("stopped accepting" in line for line in server.lines)

        server.process.send_signal(signal.SIGTERM)  # the second ends it
        await server.process.wait()


async def test_jobs_worker_probes_and_drain_delay(tmp_path: Path) -> None:
    delay = 1.5
    store = f"sqlite:///{tmp_path / 'jobs.db'}"
    async with ready(
        "jobs_service.py", "--store", store, "worker", "--drain-delay", str(delay)
    ) as (worker, health):
        signalled = time.monotonic()
        worker.process.send_signal(signal.SIGTERM)
        await worker.wait_logged(WITHDRAWN)
        assert await probe(health, "/readyz") == 503
        await worker.wait_logged(r"shutting down .*after the drain delay")
        assert time.monotonic() - signalled >= delay
        assert await worker.process.wait() == 0
