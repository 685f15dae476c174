"""Probes get through a flood of the health port: a real program, real sockets.

A `trio_graceful.run` program with a health endpoint runs in a subprocess;
this test holds 300 idle TCP connections and a 64-connection slowloris on its
port (loopback only), then sends 10 ``/livez`` and 10 ``/readyz`` probes one
after the other, as a kubelet would, and requires each answered 200 within a
second: the kubelet's default ``timeoutSeconds``. The setup (connecting, and
waiting until the endpoint has closed every idle connection to make room)
is outside the timed part; every wait is on an event, none is a sleep.
"""

from __future__ import annotations

import signal
import subprocess
import textwrap
import time
from pathlib import Path

import attrs
import pytest
import trio

from tests.run.test_runner_probes import probe_at
from tests.run.test_runner_realtime import start_ready

pytestmark = pytest.mark.realtime

IDLE = 300
SLOWLORIS = 64
PROBES = 10  # pairs
PROBE_TIMEOUT = 1.0  # the kubelet's default timeoutSeconds
CAP = 32  # the default max_connections

PROGRAM = textwrap.dedent(
    """
    import logging, sys
    import trio
    import trio_graceful

    async def main():
        address = trio_graceful.current_runner().health_address
        print("ready", flush=True)
        print("port", address[1], flush=True)
        await trio.sleep_forever()

    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(name)s: %(message)s"
    )
    sys.exit(trio_graceful.run(main, grace=2, health_port=0, health_host="127.0.0.1"))
    """
)

# The head of a request that never ends: a slowloris sends it a byte at a time.
HEAD = b"GET /livez HTTP/1.1\r\nHost: probe\r\nX-Slow: " + b"x" * 4000


@attrs.define
class Flood:
    port: int
    idle_closed: int = 0
    idle_all_closed: trio.Event = attrs.field(factory=trio.Event)
    slowloris_connections: int = 0
    slowloris_started: int = 0
    slowloris_all_started: trio.Event = attrs.field(factory=trio.Event)
    done: trio.Event = attrs.field(factory=trio.Event)


async def hold_idle(flood: Flood, stream: trio.SocketStream) -> None:
    """Send nothing; count the connection when the endpoint closes it."""
    async with stream:
        try:
            while await stream.receive_some():
                raise AssertionError("an idle connection got an answer")
        except trio.BrokenResourceError:
            pass  # a reset is a close too
    flood.idle_closed += 1
    if flood.idle_closed == IDLE:
        flood.idle_all_closed.set()


async def slowloris(flood: Flood) -> None:
    """Trickle a head a byte every 0.1 s; when closed, come back at once."""
    first = True
    for _ in range(10_000):  # bounded; `done` ends it long before
        if flood.done.is_set():
            return
        stream = await trio.open_tcp_stream("127.0.0.1", flood.port)
        flood.slowloris_connections += 1
        async with stream:
            try:
                for byte in HEAD:
                    await stream.send_all(bytes([byte]))
                    if first:
                        first = False
                        flood.slowloris_started += 1
                        if flood.slowloris_started == SLOWLORIS:
                            flood.slowloris_all_started.set()
                    with trio.move_on_after(0.1):
                        if not await stream.receive_some():
                            break  # closed: its slot went to someone else
                        raise AssertionError("a slowloris got an answer")
            except trio.BrokenResourceError:
                pass


async def probe(port: int, path: str) -> tuple[int, float]:
    """One kubelet-like probe on a new connection: its status and how long it took."""
    start = time.monotonic()
    status, _ = await probe_at(("127.0.0.1", port), path)
    return status, time.monotonic() - start


def start_program(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    process = start_ready(tmp_path, PROGRAM)
    assert process.stdout is not None
    word, port = process.stdout.readline().split()
    assert word == b"port"
    return process, int(port)


async def test_probes_are_answered_within_a_second_under_a_flood(
    tmp_path: Path,
) -> None:
    process, port = await trio.to_thread.run_sync(start_program, tmp_path)
    flood = Flood(port)
    latencies: list[tuple[str, int, float]] = []
    try:
        async with trio.open_nursery() as nursery:
            with trio.fail_after(60):  # setup: generous, and not the timed part
                for _ in range(IDLE):
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                    nursery.start_soon(hold_idle, flood, stream)
                for _ in range(SLOWLORIS):
                    nursery.start_soon(slowloris, flood)
                await flood.slowloris_all_started.wait()
                # Every idle connection was closed to admit a newer one: the
                # slots are the slowloris's now.
                await flood.idle_all_closed.wait()
            before = flood.slowloris_connections
            for _ in range(PROBES):
                for path in ("/livez", "/readyz"):
                    with trio.fail_after(30):  # a hang fails; the bound is below
                        status, elapsed = await probe(port, path)
                    latencies.append((path, status, elapsed))
            # The slowloris kept at it while the probes went through.
            assert flood.slowloris_connections > before
            flood.done.set()
            nursery.cancel_scope.cancel()
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = await trio.to_thread.run_sync(process.communicate, None, 30)
    print("probe latencies (s):", [round(e, 4) for _, _, e in latencies])
    assert [(path, status) for path, status, _ in latencies] == [
        ("/livez", 200),
        ("/readyz", 200),
    ] * PROBES
    assert max(elapsed for _, _, elapsed in latencies) < PROBE_TIMEOUT
    assert process.returncode == 128 + signal.SIGTERM  # a graceful stop on SIGTERM
    # One line with the counts every 10 s at most, not one per connection.
    reports = [
        line
        for line in stderr.decode().splitlines()
        if line.startswith(
            f"trio_graceful.health: health endpoint at max_connections={CAP}:"
        )
    ]
    assert 1 <= len(reports) <= 10, reports
    assert "Traceback" not in stderr.decode()
