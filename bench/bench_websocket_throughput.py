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

    python bench/bench_websocket_throughput.py [--seconds 3] [--repetitions 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

ROOT = Path(__file__).resolve().parent.parent
SERVERS = {
    "example": ROOT / "examples" / "websocket_close_server.py",
    "sansio": ROOT / "bench" / "sansio_reference_server.py",
    "trio_websocket": ROOT / "bench" / "trio_websocket_reference_server.py",
    "websockets": ROOT / "bench" / "websockets_reference_server.py",
}
CONNECTIONS = 100
WINDOW = 8  # requests in flight per connection
WARMUP = 0.5
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
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


async def measure_once(kind: str, seconds: float) -> dict[str, float]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SERVERS[kind]),
        "--port",
        "0",
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        line = (await process.stderr.readline()).decode()
        url = re.search(r"listening on (ws://\S+)", line).group(1)  # type: ignore[union-attr]
        clients = [await connect(url, ping_interval=None) for _ in range(CONNECTIONS)]
        counter = [0]
        stop = asyncio.Event()
        tasks = [asyncio.ensure_future(pipeline(ws, counter, stop)) for ws in clients]
        await asyncio.sleep(WARMUP)
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
    return {
        "requests_per_s": replies / elapsed,
        "server_cpu_us_per_request": cpu / replies * 1e6,
    }


async def measure(seconds: float, repetitions: int) -> dict[str, Any]:
    kinds = list(SERVERS)
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for repetition in range(repetitions):
        start = repetition % len(kinds)
        for kind in kinds[start:] + kinds[:start]:
            runs[kind].append(await measure_once(kind, seconds))
    result: dict[str, Any] = {"servers": {}, "ratios": {}}
    for kind, samples in runs.items():
        result["servers"][kind] = {
            key: statistics.median(s[key] for s in samples) for key in samples[0]
        }
    for ours, base in [
        ("example", "sansio"),
        ("example", "websockets"),
        ("trio_websocket", "websockets"),
        ("sansio", "websockets"),
    ]:
        result["ratios"][f"{ours}/{base}"] = {
            "cpu_per_request": statistics.median(
                a["server_cpu_us_per_request"] / b["server_cpu_us_per_request"]
                for a, b in zip(runs[ours], runs[base], strict=True)
            ),
            "requests_per_s": statistics.median(
                a["requests_per_s"] / b["requests_per_s"]
                for a, b in zip(runs[ours], runs[base], strict=True)
            ),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    result = asyncio.run(measure(args.seconds, args.repetitions))
    print(
        f"{CONNECTIONS} connections x {WINDOW} requests in flight, "
        f"medians of {args.repetitions} runs of {args.seconds:g} s"
    )
    for kind, server in result["servers"].items():
        print(
            f"  {kind:15} {server['requests_per_s']:9,.0f} requests/s  "
            f"{server['server_cpu_us_per_request']:6.1f} us server CPU per request"
        )
    for name, ratio in result["ratios"].items():
        print(
            f"  {name:28} CPU/request {ratio['cpu_per_request']:.2f}x  "
            f"requests/s {ratio['requests_per_s']:.2f}x"
        )
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
