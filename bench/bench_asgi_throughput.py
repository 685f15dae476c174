"""ASGI throughput: requests per second and server cost per request, steady state.

The same Starlette app (``bench/asgi_app.py``) under the three servers of
``_asgi_clients.SERVERS``: trio_graceful (``serve_asgi`` under
``trio_graceful.run``), Hypercorn's Trio worker alone, and uvicorn (h11).
100 keep-alive clients (raw HTTP/1.1 on Trio, in this process) each send
``GET /work?ms=0``, one at a time, for a few seconds, against one server at
a time, every server in every repetition, in rotated order. Measured:
responses per second, and the server process's CPU time (user + system,
from /proc) per response. The clients share the machine, so responses per
second depend on them too; CPU per response is the server's own cost.

On a machine shared with other work CPU time moves by 10 % or more from run
to run, so a full run also counts the server's instructions per request
with Valgrind's callgrind (where it is installed): ``CONNECTIONS_COUNTED``
connections each send ``REQUESTS_COUNTED`` requests against a server under
callgrind, which is then stopped with SIGINT, and the count of a run that
opens the same connections but sends no request is subtracted. The goal,
trio_graceful at most 1.05 times Hypercorn alone per request, is judged on
that count when it was taken, else on CPU time.

Run ``python bench/bench_asgi_throughput.py [--quick] [--seconds S]
[--repetitions R] [--no-instructions]`` for this benchmark alone (it prints
its tables and goals, then the results as JSON), or ``python
bench/run_all.py --only asgi_throughput``.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from typing import Any

import _cli
import _common
import trio
from _asgi_clients import SERVERS, ClientConnection, open_connections, serving
from bench_websocket_throughput import cpu_seconds

TITLE = "10. ASGI throughput: keep-alive requests of no work"

FULL = {"seconds": 3.0, "repetitions": 3, "connections": 100, "warm_up_s": 0.5}
QUICK = {"seconds": 0.5, "repetitions": 1, "connections": 20, "warm_up_s": 0.2}
MEASURES = ("requests_per_s", "server_cpu_us_per_request")
BASELINES = ("hypercorn", "uvicorn")
GOAL = 1.05  # server cost per request, trio_graceful / Hypercorn alone
CONNECTIONS_COUNTED = 100
REQUESTS_COUNTED = 20  # per connection
CALLGRIND = ("valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null")
CALLGRIND_STARTUP = 600.0  # seconds: the interpreter is about 50 times slower
# Hypercorn's worker in the main process, where /proc and callgrind see it
# (by default a supervisor process runs it in a child of its own).
OPTIONS = {"hypercorn": ("--workers", "0")}


async def request_loop(
    connection: ClientConnection, requests: float, counter: list[int]
) -> None:
    """Send ``requests`` requests one at a time (`math.inf`: until cancelled)."""
    sent = 0
    while sent < requests:
        await connection.send([(sent, 0)])
        sent += 1
        answer = await connection.receive()
        if answer is None or answer.status != 200:
            raise RuntimeError(f"request {sent} on a connection was not answered")
        counter[0] += 1


async def measure_once(
    kind: str, *, seconds: float, connections: int, warm_up_s: float
) -> dict[str, float]:
    """Start a server, keep the clients busy, count responses and server CPU."""
    async with serving(kind, options=OPTIONS.get(kind, ())) as (server, port):
        clients = await open_connections(port, connections)
        counter = [0]
        async with trio.open_nursery() as nursery:
            for client in clients:
                nursery.start_soon(request_loop, client, float("inf"), counter)
            await trio.sleep(warm_up_s)
            pid = server.process.pid
            answered0, cpu0, t0 = counter[0], cpu_seconds(pid), time.perf_counter()
            await trio.sleep(seconds)
            answered = counter[0] - answered0
            cpu = cpu_seconds(pid) - cpu0
            elapsed = time.perf_counter() - t0
            nursery.cancel_scope.cancel()
        for client in clients:
            await client.aclose()
    if answered == 0:
        raise RuntimeError(f"the {kind} server sent no response in {seconds:g} s")
    return {
        "requests_per_s": answered / elapsed,
        "server_cpu_us_per_request": cpu / answered * 1e6,
    }


async def count_once(kind: str, requests: int) -> int:
    """The instructions a server runs, started and stopped, serving ``requests``
    requests on each of ``CONNECTIONS_COUNTED`` connections."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    async with serving(
        kind,
        prefix=CALLGRIND,
        env=env,
        startup_timeout=CALLGRIND_STARTUP,
        options=OPTIONS.get(kind, ()),
    ) as (server, port):
        clients = await open_connections(port, CONNECTIONS_COUNTED)
        async with trio.open_nursery() as nursery:
            for client in clients:
                nursery.start_soon(request_loop, client, requests, [0])
        for client in clients:
            await client.aclose()
        server.process.send_signal(signal.SIGINT)
        with trio.fail_after(CALLGRIND_STARTUP):
            await server.process.wait()
            collected = await server.wait_logged(r"Collected : (\d+)")
    return int(collected.group(1))


def count_instructions() -> dict[str, float]:
    """Instructions per request of each server."""
    counts: dict[str, float] = {}
    for kind in SERVERS:
        print(f"counting the instructions of {kind} ...", file=sys.stderr, flush=True)
        empty = trio.run(count_once, kind, 0)
        full = trio.run(count_once, kind, REQUESTS_COUNTED)
        counts[kind] = (full - empty) / (REQUESTS_COUNTED * CONNECTIONS_COUNTED)
    return counts


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

    def sample(kind: str) -> dict[str, float]:
        return trio.run(
            lambda: measure_once(
                kind,
                seconds=seconds,
                connections=connections,
                warm_up_s=settings["warm_up_s"],
            )
        )

    runs = _common.interleave(list(SERVERS), repetitions, sample)
    if instructions is None:
        instructions = not quick and shutil.which("valgrind") is not None
    return {
        "title": TITLE,
        "instructions_per_request": count_instructions() if instructions else None,
        "seconds": seconds,
        "repetitions": repetitions,
        "connections": connections,
        "warm_up_s": settings["warm_up_s"],
        "servers": {
            kind: {
                "label": SERVERS[kind].label,
                **{
                    key: _common.summarize([sample[key] for sample in samples])
                    for key in MEASURES
                },
            }
            for kind, samples in runs.items()
        },
        # The median of the ratios taken within each repetition.
        "ratios": {
            f"trio_graceful/{baseline}": {
                key: _common.paired_ratio(
                    [sample[key] for sample in runs["trio_graceful"]],
                    [sample[key] for sample in runs[baseline]],
                )
                for key in MEASURES
            }
            for baseline in BASELINES
        },
    }


def tables(result: dict[str, Any]) -> list[_common.Table]:
    rows = [
        [
            server["label"],
            f"{server['requests_per_s']['median']:,.0f}",
            f"{server['server_cpu_us_per_request']['median']:.0f} µs",
        ]
        for server in result["servers"].values()
    ]
    rows += [
        [
            f"ratio {pair} (median of paired runs)",
            _common.fmt_ratio(ratio["requests_per_s"]),
            _common.fmt_ratio(ratio["server_cpu_us_per_request"]),
        ]
        for pair, ratio in result["ratios"].items()
    ]
    counted = result.get("instructions_per_request")
    return [
        *([] if counted is None else [_instruction_table(counted)]),
        _common.Table(
            title=f"{TITLE} ({result['connections']:,} connections)",
            columns=["server", "requests/s", "server CPU per request"],
            rows=rows,
            notes=[
                f"Medians of {_common.plural(result['repetitions'], 'run')} of "
                f"{result['seconds']:g} s per server, after {result['warm_up_s']:g} s "
                "of warm-up; one request in flight per keep-alive connection.",
                "The clients run in the measuring process, on the same machine: "
                "requests/s depends on them too; the server's CPU time per request "
                "(user + system) is its own cost.",
            ],
        ),
    ]


def _instruction_table(counted: dict[str, float]) -> _common.Table:
    rows = [[SERVERS[kind].label, f"{count:,.0f}"] for kind, count in counted.items()]
    rows += [
        [
            f"ratio trio_graceful/{baseline}",
            _common.fmt_ratio(counted["trio_graceful"] / counted[baseline]),
        ]
        for baseline in BASELINES
    ]
    return _common.Table(
        title=f"{TITLE}: instructions per request (callgrind)",
        columns=["server", "instructions per request"],
        rows=rows,
        notes=[
            f"{CONNECTIONS_COUNTED} keep-alive connections of {REQUESTS_COUNTED} "
            "requests each, one at a time, minus a run that opens the same "
            "connections and sends nothing; the count does not depend on the "
            "machine's load."
        ],
    )


def goals(result: dict[str, Any]) -> list[_common.Goal]:
    """trio_graceful's cost per request against Hypercorn's own worker."""
    cpu = result["ratios"]["trio_graceful/hypercorn"]["server_cpu_us_per_request"]
    measured = f"CPU time {_common.fmt_ratio(cpu)}"
    ratio = cpu
    counted = result.get("instructions_per_request")
    if counted is not None:
        ratio = counted["trio_graceful"] / counted["hypercorn"]
        measured = f"instructions {_common.fmt_ratio(ratio)}; {measured}"
    requests_per_s = result["ratios"]["trio_graceful/hypercorn"]["requests_per_s"]
    return [
        _common.Goal(
            item=f"10. ASGI throughput, {result['connections']:,} keep-alive "
            "clients: server cost per request, vs Hypercorn alone",
            target=f"≤ {GOAL:.2f}x",
            measured=f"{measured} (requests/s {_common.fmt_ratio(requests_per_s)})",
            met=ratio <= GOAL,
        )
    ]


def main(argv: list[str] | None = None) -> None:
    _cli.throughput_main(__name__, argv)


if __name__ == "__main__":
    main()
