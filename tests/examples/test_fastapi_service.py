"""The FastAPI example, run as users run it: it answers, and at the first
signal its stream hears STOP, ends with ``event: bye``, and the program exits
with the status of the default exit codes."""

from __future__ import annotations

import signal
import subprocess
import sys

import httpx
import pytest
import trio

from tests.support.examples import EXAMPLES
from tests.support.processes import PATIENCE, LineReader, running

pytestmark = pytest.mark.realtime


async def _through_signal(
    port: int, process: subprocess.Popen[bytes], signum: int
) -> tuple[dict[str, int], list[str]]:
    """Ask for some work, open a stream, send ``signum``, and read the rest."""
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as client:
        work = (await client.get(f"{base}/work?ms=10")).json()
        async with client.stream("GET", f"{base}/events?ms=50") as response:
            lines = response.aiter_lines()
            assert await anext(lines) == "data: 0"
            process.send_signal(signum)
            rest = [line async for line in lines]
    return work, rest


@pytest.mark.parametrize(
    ("signum", "status"),
    [(signal.SIGTERM, 0), (signal.SIGINT, 128 + signal.SIGINT)],
    ids=["SIGTERM", "SIGINT"],
)
def test_a_signal_ends_the_stream_with_bye_then_the_lifespan(signum: int, status: int):
    argv = [sys.executable, str(EXAMPLES / "fastapi_service.py"), "--port", "0"]
    with running(argv) as process:
        assert process.stderr is not None
        errors = LineReader(process.stderr)
        port = int(errors.until("fastapi_service: listening on ").rsplit(":", 1)[1])
        work, rest = trio.run(_through_signal, port, process, signum)
        lines = errors.rest()
        # the default ExitCodes: SIGTERM is clean, SIGINT is 128 + 2
        assert process.wait(PATIENCE) == status
    assert work == {"worked_ms": 10}
    last = sum(line.startswith("data: ") for line in rest)
    assert rest == [
        "",
        *(line for i in range(1, last) for line in (f"data: {i}", "")),
        "event: bye",
        f"data: {last}",
        "",
    ]
    assert "fastapi_service: startup" in errors.seen
    assert not [line for line in errors.seen if "Traceback" in line]
    name = signal.Signals(signum).name
    assert lines[0] == f"trio_graceful.runner: {name}: shutting down (grace 10 s)"
    draining = [line for line in lines if "STOP: draining" in line]
    assert len(draining) == 1
    # The lifespan's shutdown comes after the drain.
    assert lines.index("fastapi_service: shutdown") > lines.index(draining[0])
