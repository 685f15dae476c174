"""``/statusz`` of ``python -m trio_graceful.asgi``: its workers, across a reload.

Real processes, signals and sockets. Every wait is for a log line or a
state seen at ``/statusz``; the bounds are only guards against a hang.
"""

from __future__ import annotations

import signal

import h11
import pytest
import trio

from tests.support.processes import PATIENCE
from tests.support.workers import asgi_command, get_statusz, open_supervisor

pytestmark = pytest.mark.realtime


def workers_of(statusz: dict[str, object]) -> list[dict[str, object]]:
    pool = statusz["workers"]
    assert isinstance(pool, dict)
    workers = pool["workers"]
    assert isinstance(workers, list)
    return workers  # type: ignore[return-value]


async def wait_statusz(port: int, in_flight: list[int | None]) -> dict[str, object]:
    """``/statusz`` once its workers say ``in_flight``, in order of their numbers."""
    with trio.fail_after(PATIENCE):
        while True:
            statusz = await get_statusz(port)
            said = [worker["requests_in_flight"] for worker in workers_of(statusz)]
            if said == in_flight:
                return statusz
            await trio.sleep(0.05)


async def hold_request(port: int, stream_out: list[trio.SocketStream]) -> None:
    """Send a request that runs for minutes, and keep its connection open."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    stream_out.append(stream)
    request = h11.Connection(h11.CLIENT)
    data = request.send(
        h11.Request(
            method="GET", target="/work?ms=600000&id=1", headers=[("Host", "x")]
        )
    )
    assert data is not None
    await stream.send_all(data + (request.send(h11.EndOfMessage()) or b""))


async def test_statusz_lists_each_worker_with_the_requests_it_runs():
    command = asgi_command(
        "--bind", "127.0.0.1:0", "--workers", "2", "--health-port", "0"
    )
    async with open_supervisor(command, workers=2) as supervisor:
        [health] = await supervisor.wait_for(r"health endpoint on port (\d+)")
        port = int(health.group(1))
        pids = supervisor.worker_pids()
        statusz = await wait_statusz(port, [0, 0])
        assert statusz["state"] == "ready"
        assert statusz["workers"] == {
            "target": 2,
            "ready": 2,
            "generation": 0,
            "reloading": False,
            "workers": [
                {
                    "number": number,
                    "generation": 0,
                    "pid": pids[number],
                    "state": "ready",
                    "status": "ready (main is ready)",
                    "requests_in_flight": 0,
                }
                for number in (1, 2)
            ],
        }
        supervisor.signal(signal.SIGHUP)
        await supervisor.wait_for("reload 1 done")
        statusz = await wait_statusz(port, [0, 0])
        new = supervisor.worker_pids()
        assert [
            (w["number"], w["pid"], w["generation"]) for w in workers_of(statusz)
        ] == [
            (3, new[3], 1),
            (4, new[4], 1),
        ]
        streams: list[trio.SocketStream] = []
        for _ in range(3):
            await hold_request(supervisor.port, streams)
        statusz = await wait_for_total(port, 3)
        assert {w["state"] for w in workers_of(statusz)} == {"ready"}
        for stream in streams:
            await stream.aclose()


async def wait_for_total(port: int, total: int) -> dict[str, object]:
    """``/statusz`` once its workers run ``total`` requests in all."""
    with trio.fail_after(PATIENCE):
        while True:
            statusz = await get_statusz(port)
            said = [w["requests_in_flight"] for w in workers_of(statusz)]
            if sum(n for n in said if isinstance(n, int)) == total:
                return statusz
            await trio.sleep(0.05)
