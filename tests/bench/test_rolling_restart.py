"""A rolling restart on loopback: no failed request when the drain delay covers the lag.

The short version of ``bench/bench_rolling_restart.py``: two real replicas of
``examples/websocket_close_server.py`` behind the benchmark's proxy, which
keeps a terminated replica in rotation until its readiness has failed and a
propagation lag has passed. The scenarios are built so that their outcome
does not depend on the machine's speed:

* with a drain delay two seconds longer than the lag, the replica listens
  for two seconds after it left the rotation, so no connection can reach it
  closed;
* with no delay, the replica stops accepting at the SIGTERM, and for the
  whole lag (five seconds) the proxy alternates new connections between the
  two replicas in rotation. The clients open a new connection every 20
  requests, so dozens of connections are opened during the lag, and every
  other one reaches the closed replica, however the first ones were split
  and however slow the machine.

The same two scenarios run with the ASGI example (``examples/asgi_service.py``)
and HTTP/1.1 keep-alive clients pipelining ``GET /work`` (``protocol="http"``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from bench_rolling_restart import rolling_restart  # noqa: E402

pytestmark = pytest.mark.realtime

CLIENTS = 4
FOREVER = 10**9  # requests per connection: the clients never reconnect by choice
SLACK = 0.005
"""Seconds: the replica's log has millisecond times, and two clocks tick here."""


async def restart(
    *,
    restarts: int,
    drain_delay: float,
    lag: float,
    per_connection: int = FOREVER,
    protocol: str = "websocket",
) -> dict[str, Any]:
    return await rolling_restart(
        restarts=restarts,
        drain_delay=drain_delay,
        lag=lag,
        clients=CLIENTS,
        per_connection=per_connection,
        min_ready=0,
        protocol=protocol,
    )


def events(result: dict[str, Any], index: int) -> dict[str, float]:
    return result["timelines"][index]["events_s"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("protocol", ["websocket", "http"])
async def test_no_request_fails_when_the_drain_delay_covers_the_lag(
    protocol: str,
) -> None:
    result = await restart(restarts=2, drain_delay=3.0, lag=1.0, protocol=protocol)
    assert result["protocol"] == protocol
    assert result["failed"] == 0, result
    assert result["answered"] == result["requests"] > 0
    # Both replicas were restarted, and their clients moved on after CLOSE 1001
    # (HTTP: after Connection: close, or an idle connection's FIN).
    assert [t["refused_connections"] for t in result["timelines"]] == [0, 0]
    assert result["connections"] > CLIENTS
    for index in range(2):
        at = events(result, index)
        # Out of rotation after the lag, and only then does it stop accepting.
        assert 0 < at["readiness_false"] <= at["removed"]
        assert 1.0 - SLACK <= at["removed"] < at["stop"]
        # (The ASGI example logs no time: its STOP is when its line was read.)
        assert 3.0 - SLACK <= at["stop"] < at["exited"] < at["replacement_ready"]


@pytest.mark.timeout(180)
async def test_requests_fail_without_a_drain_delay() -> None:
    result = await restart(restarts=1, drain_delay=0.0, lag=5.0, per_connection=20)
    assert result["failed"] >= 1, result
    # Each failure is a connection the proxy sent to the closed replica.
    [timeline] = result["timelines"]
    assert result["failed_connect"] == result["failed"] == timeline["failed"]
    assert timeline["refused_connections"] >= 1
    at = events(result, 0)
    assert 0 < at["first_refused_connection"] < at["removed"]
    assert at["removed"] >= 5.0 - SLACK


@pytest.mark.timeout(180)
async def test_http_requests_fail_without_a_drain_delay() -> None:
    result = await restart(
        restarts=1, drain_delay=0.0, lag=5.0, per_connection=20, protocol="http"
    )
    [timeline] = result["timelines"]
    assert result["failed_connect"] >= 1, result
    assert result["failed_bad_answer"] == 0
    assert timeline["refused_connections"] >= 1
    at = events(result, 0)
    assert 0 < at["first_refused_connection"] < at["removed"]
    assert at["removed"] >= 5.0 - SLACK
