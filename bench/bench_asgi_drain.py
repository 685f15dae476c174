"""ASGI drain: requests dropped, and connections closed without notice, at SIGTERM.

The same Starlette app (``bench/asgi_app.py``) under three servers, each a
process of its own (``_asgi_clients.SERVERS``): trio_graceful's
``serve_asgi`` under ``trio_graceful.run``, Hypercorn's Trio worker alone
(``--graceful-timeout 5``), and uvicorn with h11
(``--timeout-graceful-shutdown 5``); trio_graceful gets ``--grace 5``.

**Drain under traffic.** N keep-alive clients (raw HTTP/1.1 on Trio, in this
process) each open one connection and keep sending ``GET /work`` of 10 to
800 ms on it until it closes; every fourth client pipelines 2 or 3 requests
at a time, the others send one at a time. After a second of traffic the
server gets SIGTERM. Counted, per server: the requests it had received and
never answered (*dropped*), the connections it closed without
``Connection: close`` on their last response although it was draining (an
idle connection closed by a FIN is not one of them), the exit status and the
time from the signal to the exit. ``_asgi_clients`` says exactly when a
request counts as received: one that was being written as the server's FIN
came is *sent after the FIN*, reported apart, and not dropped.

**Idle connections.** 1,000 keep-alive connections, each after one request,
then idle for `IDLE_S` seconds; SIGTERM; measured until every client has
seen its connection closed, and until the server has exited. (Idle for
longer than trio_graceful's ``DRAIN_KEEP_ALIVE``: a connection answered
less than that before STOP waits for its client's next request, and is not
idle in the sense measured here.)

The full run measures 40 and 200 clients, then 1,000 idle connections, five
times per server each, the servers in an order rotated between repetitions;
ratios are taken within a repetition. ``--quick``: 8 and 16 clients, 50 idle
connections, once each.

Run ``python bench/bench_asgi_drain.py [--quick] [--repetitions R]`` for
this benchmark alone (it prints its tables and goals, then the results as
JSON), or ``python bench/run_all.py --only asgi_drain``.
"""

from __future__ import annotations

import functools
import itertools
import random
import signal
import statistics
from collections import Counter
from typing import Any

import _cli
import _common
import trio
from _asgi_clients import (
    GRACE,
    SERVERS,
    ClientConnection,
    Stale,
    notice,
    open_connections,
    serving,
)
from bench_websocket_drain import raise_open_file_limit

TITLE = "9. ASGI drain: the same Starlette app under three servers"

FULL = {"clients": (40, 200), "idle": 1_000, "repetitions": 5, "traffic_s": 1.0}
QUICK = {"clients": (8, 16), "idle": 50, "repetitions": 1, "traffic_s": 0.5}
WORK_MS = (10, 800)
PIPELINE = (2, 3)  # requests at once, for every fourth client
MAX_REQUESTS = 1_000  # per connection: a bound, never reached in a run
TIMEOUT = 60.0  # a bound against hangs, far above any expected time
IDLE_S = 1.5  # between the last answer and SIGTERM, in the idle case
NOTICES = ("close", "idle", "none")
BASELINES = ("hypercorn", "uvicorn")


async def keep_sending(
    connection: ClientConnection, pipelining: bool, rng: random.Random
) -> float:
    """Send requests until the connection closes; return when it did."""
    ids = itertools.count()
    while connection.sent < MAX_REQUESTS:
        size = rng.randint(*PIPELINE) if pipelining else 1
        batch = [(next(ids), rng.randint(*WORK_MS)) for _ in range(size)]
        try:
            await connection.send(batch)
        except Stale:
            break
        while connection.outstanding:
            answer = await connection.receive()
            if answer is None:
                return trio.current_time()
            if answer.close:
                break
        else:
            continue
        break
    await connection.wait_closed()
    return trio.current_time()


async def signal_and_wait(server: Any, signalled_at: list[float]) -> float:
    """SIGTERM the server; return the seconds until it exited."""
    signalled_at.append(trio.current_time())
    server.process.send_signal(signal.SIGTERM)
    await server.process.wait()
    return trio.current_time() - signalled_at[0]


async def drain_once(kind: str, clients: int, traffic_s: float, seed: int) -> dict:
    """Traffic from ``clients`` connections, SIGTERM, and the books of each."""
    with trio.fail_after(TIMEOUT):
        async with serving(kind) as (server, port):
            connections = await open_connections(port, clients)
            ends: list[float] = [0.0] * clients
            signalled_at: list[float] = []

            async def client(index: int) -> None:
                rng = random.Random(seed * 1000 + index)
                ends[index] = await keep_sending(
                    connections[index], index % 4 == 3, rng
                )

            async with trio.open_nursery() as nursery:
                for index in range(clients):
                    nursery.start_soon(client, index)
                await trio.sleep(traffic_s)
                exit_s = await signal_and_wait(server, signalled_at)
    t0 = signalled_at[0]
    for connection in connections:
        await connection.aclose()
    notices = Counter(notice(c, t0) for c in connections)
    return {
        "sent": sum(c.sent for c in connections),
        "answered": sum(len(c.answers) for c in connections),
        "answered_after_signal": sum(
            a.at >= t0 for c in connections for a in c.answers
        ),
        "not_200": sum(a.status != 200 for c in connections for a in c.answers),
        "dropped": sum(c.dropped for c in connections),
        "sent_after_fin": sum(c.sent_after_fin for c in connections),
        **{f"connections_{name}": notices[name] for name in NOTICES},
        "resets": sum(c.ended == "reset" for c in connections),
        "all_closed_s": max(ends) - t0,
        "exit_s": exit_s,
        "exit_status": server.process.returncode,
        "drops": [drop_detail(c, t0) for c in connections if c.dropped],
    }


def drop_detail(connection: ClientConnection, signalled_at: float) -> dict:
    """What a connection that dropped requests saw, to tell why."""
    last = connection.answers[-1] if connection.answers else None
    return {
        "dropped": connection.dropped,
        "answers": len(connection.answers),
        "last_answer_s": None if last is None else last.at - signalled_at,
        "last_said_close": last is not None and last.close,
        "ended": connection.ended,
    }


async def idle_once(kind: str, connections_n: int) -> dict:
    """Connections idle after one request each; SIGTERM; time until all closed."""
    with trio.fail_after(TIMEOUT):
        async with serving(kind) as (server, port):
            connections = await open_connections(port, connections_n)
            for index, connection in enumerate(connections):
                await connection.send([(index, 0)])
            for connection in connections:
                answer = await connection.receive()
                if answer is None or answer.status != 200:
                    raise RuntimeError(f"{kind}: no answer to the first request")
            await trio.sleep(IDLE_S)
            ends: list[float] = []

            async def wait_closed(connection: ClientConnection) -> None:
                await connection.wait_closed()
                ends.append(trio.current_time())

            signalled_at: list[float] = []
            async with trio.open_nursery() as nursery:
                for connection in connections:
                    nursery.start_soon(wait_closed, connection)
                exit_s = await signal_and_wait(server, signalled_at)
    for connection in connections:
        await connection.aclose()
    return {
        "all_closed_s": max(ends) - signalled_at[0],
        "exit_s": exit_s,
        "exit_status": server.process.returncode,
        "resets": sum(c.ended == "reset" for c in connections),
    }


def summarize_runs(runs: list[dict]) -> dict[str, Any]:
    """Per measure: the median, and the total over the runs (counts)."""
    summary: dict[str, Any] = {"runs": len(runs)}
    for key in runs[0]:
        values = [run_[key] for run_ in runs]
        if key == "exit_status":
            summary["exit_statuses"] = sorted(set(values))
        elif key == "drops":
            summary[key] = [drop for value in values for drop in value]
        elif key.endswith("_s"):
            summary[key] = {"median": statistics.median(values), "max": max(values)}
        else:
            summary[key] = {"median": statistics.median(values), "total": sum(values)}
    return summary


def measure_case(sample: Any, repetitions: int) -> dict[str, Any]:
    """Every server, ``repetitions`` times in rotated order; medians and ratios."""
    runs = _common.interleave(list(SERVERS), repetitions, sample)
    return {
        "repetitions": repetitions,
        "servers": {
            kind: {"label": SERVERS[kind].label, **summarize_runs(samples)}
            for kind, samples in runs.items()
        },
        "ratios_of_trio_graceful_to": {
            baseline: {
                key: _common.paired_ratio(
                    [r[key] for r in runs["trio_graceful"]],
                    [r[key] for r in runs[baseline]],
                )
                for key in ("all_closed_s", "exit_s")
            }
            for baseline in BASELINES
        },
    }


def run(*, quick: bool = False, repetitions: int | None = None) -> dict[str, Any]:
    """Run the benchmark; return its results as a JSON-ready dict."""
    settings = QUICK if quick else FULL
    repetitions = settings["repetitions"] if repetitions is None else repetitions
    if repetitions < 1:
        raise ValueError(f"repetitions must be >= 1, not {repetitions}")
    open_files = raise_open_file_limit(settings["idle"])
    drains = []
    for clients in settings["clients"]:
        seeds = itertools.count()

        def sample(kind: str, clients: int = clients, seeds: Any = seeds) -> dict:
            drain = functools.partial(
                drain_once, kind, clients, settings["traffic_s"], next(seeds)
            )
            return trio.run(drain)

        drains.append({"clients": clients, **measure_case(sample, repetitions)})
    idle = {
        "connections": settings["idle"],
        **measure_case(
            lambda kind: trio.run(idle_once, kind, settings["idle"]), repetitions
        ),
    }
    return {
        "title": TITLE,
        "grace_s": GRACE,
        "traffic_s": settings["traffic_s"],
        "work_ms": list(WORK_MS),
        "open_file_limit": open_files,
        "drains": drains,
        "idle": idle,
    }


def _count(server: dict, key: str) -> str:
    value = server[key]
    return f"{value['median']:g} ({value['total']:,})"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def _exits(server: dict) -> str:
    return ", ".join(map(str, server["exit_statuses"]))


DRAIN_COLUMNS = [
    "server",
    "answered",
    "dropped",
    "closed without Connection: close",
    "closed with Connection: close",
    "idle, closed by FIN",
    "sent after the FIN",
    "SIGTERM → exit",
    "exit status",
]


def drain_table(result: dict[str, Any], case: dict[str, Any]) -> _common.Table:
    rows = [
        [
            server["label"],
            _count(server, "answered"),
            _count(server, "dropped"),
            _count(server, "connections_none"),
            _count(server, "connections_close"),
            _count(server, "connections_idle"),
            _count(server, "sent_after_fin"),
            _ms(server["exit_s"]["median"]),
            _exits(server),
        ]
        for server in case["servers"].values()
    ]
    return _common.Table(
        title=f"{TITLE}: {case['clients']} keep-alive clients, SIGTERM mid-traffic",
        columns=DRAIN_COLUMNS,
        rows=rows,
        notes=[
            f"Each cell: the median of {_common.plural(case['repetitions'], 'run')} "
            "per server, and in brackets the total over the runs. Every fourth "
            f"client pipelines {PIPELINE[0]} or {PIPELINE[1]} requests; work "
            f"{WORK_MS[0]} to {WORK_MS[1]} ms; SIGTERM after "
            f"{result['traffic_s']:g} s of traffic; grace {result['grace_s']:g} s.",
            "Dropped: received by the server (in its socket before its FIN) and "
            "never answered. Sent after the FIN: written as the server's FIN "
            "came, never processed, and safe to send again; not dropped. Closed "
            "without Connection: close: the last response came after the "
            "signal without it, or requests were dropped; an idle connection "
            "closed by a FIN is counted apart.",
        ],
    )


def idle_table(idle: dict[str, Any]) -> _common.Table:
    rows = [
        [
            server["label"],
            _ms(server["all_closed_s"]["median"]),
            _ms(server["exit_s"]["median"]),
            _count(server, "resets"),
            _exits(server),
        ]
        for server in idle["servers"].values()
    ]
    rows += [
        [
            f"ratio trio_graceful / {baseline} (median of paired runs)",
            _common.fmt_ratio(ratio["all_closed_s"]),
            _common.fmt_ratio(ratio["exit_s"]),
            "",
            "",
        ]
        for baseline, ratio in idle["ratios_of_trio_graceful_to"].items()
    ]
    return _common.Table(
        title=f"{TITLE}: {idle['connections']:,} idle keep-alive connections",
        columns=[
            "server",
            "SIGTERM → all clients closed",
            "SIGTERM → exit",
            "closed by a reset",
            "exit status",
        ],
        rows=rows,
        notes=[
            f"Medians of {_common.plural(idle['repetitions'], 'run')} per server; "
            f"each connection made one request, then stayed idle {IDLE_S:g} s "
            "before the signal; a reset is counted with the median and, in "
            "brackets, the total."
        ],
    )


def tables(result: dict[str, Any]) -> list[_common.Table]:
    return [
        *(drain_table(result, case) for case in result["drains"]),
        idle_table(result["idle"]),
    ]


def goals(result: dict[str, Any]) -> list[_common.Goal]:
    """No drop and no close without notice, every run; idle close no slower."""
    found = []
    for case in result["drains"]:
        ours = case["servers"]["trio_graceful"]
        dropped = ours["dropped"]["total"]
        unnoticed = ours["connections_none"]["total"]
        found.append(
            _common.Goal(
                item=f"9. ASGI drain, {case['clients']} keep-alive clients: requests "
                "dropped, connections closed without Connection: close",
                target="0 and 0 in every run; exit 0",
                measured=f"{dropped:,} and {unnoticed:,} in "
                f"{_common.plural(ours['runs'], 'run')}; exit {_exits(ours)}",
                met=dropped == 0 and unnoticed == 0 and ours["exit_statuses"] == [0],
            )
        )
    idle = result["idle"]
    ratio = idle["ratios_of_trio_graceful_to"]["hypercorn"]
    found.append(
        _common.Goal(
            item=f"9. ASGI drain, {idle['connections']:,} idle keep-alive "
            "connections: SIGTERM to all closed, vs Hypercorn alone",
            target="≤ 1.00x",
            measured=f"{_common.fmt_ratio(ratio['all_closed_s'])} (exit "
            f"{_common.fmt_ratio(ratio['exit_s'])})",
            met=ratio["all_closed_s"] <= 1.0,
        )
    )
    return found


def main(argv: list[str] | None = None) -> None:
    parser = _cli.argument_parser(__doc__, gc_option=False)
    parser.add_argument(
        "--repetitions",
        type=int,
        help=f"runs per server and case (default {FULL['repetitions']})",
    )
    args = parser.parse_args(argv)
    result = run(quick=args.quick, repetitions=args.repetitions)
    _cli.print_results(__name__, result)


if __name__ == "__main__":
    main()
