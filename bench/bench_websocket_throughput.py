"""WebSocket throughput: requests per second and server CPU per request.

100 connections (the ``websockets`` client, one asyncio event loop in this
process) each keep 8 requests of no work in flight, for a few seconds, against
one server process at a time, every server in every repetition, in rotated
order. Measured: replies per second, and the server process's CPU time (user
+ system, from /proc) per reply. The client shares the machine, so replies
per second depend on it too; CPU per reply is the server's own cost.

Servers, all speaking the example's protocol:

* ``example``: examples/websocket_close_server.py (trio_graceful, and the
  sans-io protocol of ``websockets`` driven from Trio streams);
* ``sansio``: bench/sansio_reference_server.py, the same connection code in
  plain Trio nurseries (what trio_graceful adds is example / sansio);
* ``trio_websocket``: bench/trio_websocket_reference_server.py;
* ``websockets``: bench/websockets_reference_server.py, the asyncio server.

CPU time moves by 10 to 15% from run to run on a busy machine, more than
the goals' margins, so the full run also counts the server's instructions
per request (Valgrind's callgrind, where it is installed): each of
``CONNECTIONS_COUNTED`` connections sends ``REQUESTS_COUNTED`` requests, 8 in
flight, against a server under callgrind, and the count of a run with no
requests is subtracted. The count does not depend on the machine's load; the
goals are judged on it when it was taken (trio-websocket, three times
slower under callgrind, is left out of it).

Run ``python bench/bench_websocket_throughput.py [--quick] [--seconds S]
[--repetitions R] [--connections N]`` for this benchmark alone (it prints its
tables and goals, then the results as JSON), or ``python bench/run_all.py``
for all of them.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import _cli
import _common
from bench_websocket_drain import ServerProcess
from websockets.asyncio.client import ClientConnection, connect

TITLE = "7. WebSocket throughput: requests of no work, kept in flight"

ROOT = Path(__file__).resolve().parent.parent
SERVERS = {
    "example": ROOT / "examples" / "websocket_close_server.py",
    "sansio": ROOT / "bench" / "sansio_reference_server.py",
    "trio_websocket": ROOT / "bench" / "trio_websocket_reference_server.py",
    "websockets": ROOT / "bench" / "websockets_reference_server.py",
}
LABELS = {
    "example": "trio_graceful (examples/websocket_close_server.py)",
    "sansio": "the same connection code in plain Trio nurseries",
    "trio_websocket": "trio-websocket, no trio_graceful",
    "websockets": "websockets asyncio server",
}
# (ours, theirs): each ratio is ours / theirs, from the same repetition.
PAIRS = (
    ("example", "sansio"),
    ("example", "websockets"),
    ("trio_websocket", "websockets"),
    ("sansio", "websockets"),
)
MEASURES = ("requests_per_s", "server_cpu_us_per_request")

FULL = {"seconds": 3.0, "repetitions": 3, "connections": 100, "warm_up_s": 0.5}
QUICK = {"seconds": 0.5, "repetitions": 1, "connections": 20, "warm_up_s": 0.2}
WINDOW = 8  # requests in flight per connection
GOAL_ADDED = 1.05  # server CPU per request, example / sansio
GOAL_WEBSOCKETS = 1.0  # server CPU per request, example / websockets
TICKS = os.sysconf("SC_CLK_TCK")
COUNTED = ("example", "sansio", "websockets")
CONNECTIONS_COUNTED = 100
REQUESTS_COUNTED = 100  # per connection


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


async def pipeline(
    ws: ClientConnection, counter: list[int], stop: asyncio.Event
) -> None:
    next_id = 0
    for _ in range(WINDOW):
        await ws.send(json.dumps({"id": next_id, "work_ms": 0}))
        next_id += 1
    while not stop.is_set():
        await ws.recv()
        counter[0] += 1
        await ws.send(json.dumps({"id": next_id, "work_ms": 0}))
        next_id += 1


async def measure_once(
    kind: str, *, seconds: float, connections: int, warm_up_s: float
) -> dict[str, float]:
    """Start a server, keep requests in flight, count replies and server CPU."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SERVERS[kind]),
        "--port",
        "0",
        stderr=asyncio.subprocess.PIPE,
    )
    server = ServerProcess(process)
    try:
        url = (await server.wait_for(r"listening on (ws://\S+)")).group(1)
        clients = [await connect(url, ping_interval=None) for _ in range(connections)]
        counter = [0]
        stop = asyncio.Event()
        tasks = [asyncio.ensure_future(pipeline(ws, counter, stop)) for ws in clients]
        await asyncio.sleep(warm_up_s)
        replies0, cpu0, t0 = counter[0], cpu_seconds(process.pid), time.perf_counter()
        await asyncio.sleep(seconds)
        replies = counter[0] - replies0
        cpu = cpu_seconds(process.pid) - cpu0
        elapsed = time.perf_counter() - t0
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        process.kill()
        await process.wait()
    if replies == 0:
        raise RuntimeError(f"the {kind} server sent no reply in {seconds:g} s")
    return {
        "requests_per_s": replies / elapsed,
        "server_cpu_us_per_request": cpu / replies * 1e6,
    }


async def _send_and_wait(url: str, requests: int) -> ClientConnection:
    """Send ``requests`` requests, ``WINDOW`` in flight, and read every reply."""
    ws = await connect(url, ping_interval=None, open_timeout=120)
    sent = 0
    for _ in range(min(WINDOW, requests)):
        await ws.send(json.dumps({"id": sent, "work_ms": 0}))
        sent += 1
    for _ in range(requests):
        await ws.recv()
        if sent < requests:
            await ws.send(json.dumps({"id": sent, "work_ms": 0}))
            sent += 1
    return ws


async def count_once(kind: str, requests: int) -> int:
    """The instructions a server runs, started and stopped, serving ``requests``
    requests on each of ``CONNECTIONS_COUNTED`` connections."""
    process = await asyncio.create_subprocess_exec(
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        str(SERVERS[kind]),
        "--port",
        "0",
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    server = ServerProcess(process)
    try:
        url = (await server.wait_for(r"listening on (ws://\S+)")).group(1)
        clients = await asyncio.gather(
            *(_send_and_wait(url, requests) for _ in range(CONNECTIONS_COUNTED))
        )
        for ws in clients:
            await ws.close()
        process.send_signal(signal.SIGINT)
        await process.wait()
        collected = await server.wait_for(r"Collected : (\d+)")
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return int(collected.group(1))


async def count_instructions() -> dict[str, float]:
    """Instructions per request of each server in `COUNTED`."""
    counts: dict[str, float] = {}
    for kind in COUNTED:
        empty = await count_once(kind, 0)
        full = await count_once(kind, REQUESTS_COUNTED)
        counts[kind] = (full - empty) / (REQUESTS_COUNTED * CONNECTIONS_COUNTED)
    return counts


async def measure(
    *, seconds: float, repetitions: int, connections: int, warm_up_s: float
) -> dict[str, list[dict[str, float]]]:
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in SERVERS}
    for _, kind in _common.schedule(list(SERVERS), repetitions):
        runs[kind].append(
            await measure_once(
                kind, seconds=seconds, connections=connections, warm_up_s=warm_up_s
            )
        )
    return runs


def run(
    *,
    quick: bool = False,
    seconds: float | None = None,
    repetitions: int | None = None,
    connections: int | None = None,
    instructions: bool | None = None,
) -> dict[str, Any]:
    """Run the benchmark; return its results as a JSON-ready dict.

    ``instructions``: count them too; by default, in a full run where
    Valgrind is installed.
    """
    settings = QUICK if quick else FULL
    seconds, repetitions, connections = _cli.throughput_sizes(
        settings, seconds, repetitions, connections
    )
    runs = asyncio.run(
        measure(
            seconds=seconds,
            repetitions=repetitions,
            connections=connections,
            warm_up_s=settings["warm_up_s"],
        )
    )
    if instructions is None:
        instructions = not quick and shutil.which("valgrind") is not None
    counted = asyncio.run(count_instructions()) if instructions else None
    return {
        "title": TITLE,
        "instructions_per_request": counted,
        "seconds": seconds,
        "repetitions": repetitions,
        "connections": connections,
        "in_flight_per_connection": WINDOW,
        "warm_up_s": settings["warm_up_s"],
        "servers": {
            kind: {
                "label": LABELS[kind],
                **{
                    key: _common.summarize([sample[key] for sample in samples])
                    for key in MEASURES
                },
            }
            for kind, samples in runs.items()
        },
        # The median of the ratios taken within each repetition.
        "ratios": {
            f"{ours}/{theirs}": {
                key: _common.paired_ratio(
                    [sample[key] for sample in runs[ours]],
                    [sample[key] for sample in runs[theirs]],
                )
                for key in MEASURES
            }
            for ours, theirs in PAIRS
        },
    }


def tables(result: dict[str, Any]) -> list[_common.Table]:
    rows = [
        [
            f"{kind}: {server['label']}",
            f"{server['requests_per_s']['median']:,.0f}",
            f"{server['server_cpu_us_per_request']['median']:.1f} µs",
        ]
        for kind, server in result["servers"].items()
    ]
    rows += [
        [
            f"ratio {pair} (median of paired runs)",
            _common.fmt_ratio(ratio["requests_per_s"]),
            _common.fmt_ratio(ratio["server_cpu_us_per_request"]),
        ]
        for pair, ratio in result["ratios"].items()
    ]
    runs = _common.plural(result["repetitions"], "run")
    counted = result.get("instructions_per_request")
    return [
        *([] if counted is None else [_instruction_table(counted)]),
        _common.Table(
            title=f"{TITLE} ({result['connections']:,} connections)",
            columns=["server", "requests/s", "server CPU per request"],
            rows=rows,
            notes=[
                f"Medians of {runs} of {result['seconds']:g} s per server, "
                f"after {result['warm_up_s']:g} s of warm-up; "
                f"{result['in_flight_per_connection']} requests in flight "
                "per connection.",
                "The clients run in this process, on the same machine: requests/s "
                "depends on them too; the server's CPU time per request "
                "(user + system) is its own cost.",
            ],
        ),
    ]


def _instruction_table(counted: dict[str, float]) -> _common.Table:
    rows = [
        [f"{kind}: {LABELS[kind]}", f"{count:,.0f}"] for kind, count in counted.items()
    ]
    rows += [
        [f"ratio {ours}/{theirs}", _common.fmt_ratio(counted[ours] / counted[theirs])]
        for ours, theirs in PAIRS
        if ours in counted and theirs in counted
    ]
    return _common.Table(
        title=f"{TITLE}: instructions per request (callgrind)",
        columns=["server", "instructions per request"],
        rows=rows,
        notes=[
            f"{CONNECTIONS_COUNTED} connections of {REQUESTS_COUNTED} requests "
            f"each, {WINDOW} in flight, minus a run with no requests; the count "
            "does not depend on the machine's load."
        ],
    )


def _goal_ratio(result: dict[str, Any], ours: str, theirs: str) -> tuple[float, str]:
    """The ratio a goal is judged on: instructions if counted, else CPU time."""
    counted = result.get("instructions_per_request")
    cpu = result["ratios"][f"{ours}/{theirs}"]["server_cpu_us_per_request"]
    shown = f"CPU time {_common.fmt_ratio(cpu)}"
    if counted is None:
        return cpu, shown
    ratio = counted[ours] / counted[theirs]
    return ratio, f"instructions {_common.fmt_ratio(ratio)}; {shown}"


def goals(result: dict[str, Any]) -> list[_common.Goal]:
    """What trio_graceful adds per request, and the example against websockets."""
    added, added_shown = _goal_ratio(result, "example", "sansio")
    versus, versus_shown = _goal_ratio(result, "example", "websockets")
    requests_per_s = result["ratios"]["example/websockets"]["requests_per_s"]
    item = f"7. WebSocket throughput, {result['connections']:,} connections"
    return [
        _common.Goal(
            item=f"{item}: what trio_graceful adds per request",
            target=f"server cost per request ≤ {GOAL_ADDED:.2f}x "
            "the same code without it",
            measured=added_shown,
            met=added <= GOAL_ADDED,
        ),
        _common.Goal(
            item=f"{item}: the example at least as fast as the websockets server",
            target=f"server cost per request ≤ {GOAL_WEBSOCKETS:.2f}x",
            measured=f"{versus_shown} (requests/s {_common.fmt_ratio(requests_per_s)})",
            met=versus <= GOAL_WEBSOCKETS,
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    _cli.throughput_main(__name__, argv)


if __name__ == "__main__":
    main()
