"""WebSocket drain: N idle connections closed with the full close handshake.

Three servers of the same protocol run as processes of their own:

* ``examples/websocket_close_server.py`` (trio_graceful, and the sans-io
  protocol of ``websockets`` driven from Trio streams),
* ``bench/websockets_reference_server.py`` (the ``websockets`` library's
  asyncio server, shut down with its own ``server.close()``),
* ``bench/trio_websocket_reference_server.py`` (plain trio-websocket with the
  same shutdown written by hand: the baseline that tells what trio_graceful
  adds apart from what Trio and trio-websocket cost).

N clients of the ``websockets`` library (one asyncio event loop in this
process) connect to a server, each checks the protocol with one request,
then stays idle. The server gets SIGTERM; every server then sends CLOSE 1001
to every connection and wait for the clients' CLOSE. Measured from the
signal: until every client has seen its connection closed (the close
handshake and the TCP close), and until the server process has exited; and
the drain time the server logs itself. Every client must see CLOSE 1001 and
a clean close. The servers are measured in turn, in an order rotated
between repetitions, and ratios are taken within each repetition.

The example is given ``--grace 5``. The full run measures 1,000
connections five times per server, then the scale case, 5,000 connections
three times per server; ``--quick`` measures 50 connections, then 100, once
each. ``--connections`` or ``--repetitions`` measure that one case instead.

Run ``python bench/bench_websocket_drain.py [--quick] [--connections N]
[--repetitions R]`` for this benchmark alone (it prints its tables, then the
results as JSON), or ``python bench/run_all.py`` for all of them.
"""

from __future__ import annotations

import asyncio
import json
import re
import resource
import signal
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

import _cli
import _common
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosedOK

TITLE = "6. WebSocket drain: idle connections closed with the full handshake"

ROOT = Path(__file__).resolve().parent.parent


class Server(NamedTuple):
    label: str
    script: Path
    drained: str
    """What its log says when it is done; group 1 is the seconds it took."""
    options: tuple[str, ...] = ()


GRACE = 5.0  # the example's --grace

SERVERS = {
    "trio_graceful": Server(
        "trio_graceful (examples/websocket_close_server.py)",
        ROOT / "examples" / "websocket_close_server.py",
        r"shutdown: .* done in ([0-9.]+) s",
        ("--grace", f"{GRACE:g}"),
    ),
    "websockets": Server(
        "websockets asyncio server, server.close()",
        ROOT / "bench" / "websockets_reference_server.py",
        r"drained \d+ connections in ([0-9.]+) s",
    ),
    "trio_websocket": Server(
        "trio-websocket, shutdown by hand (no trio_graceful)",
        ROOT / "bench" / "trio_websocket_reference_server.py",
        r"drained \d+ connections in ([0-9.]+) s",
    ),
}
# Each ratio is trio_graceful's time over that server's, from the same round.
BASELINES = ("websockets", "trio_websocket")
MEASURES = ("all_closed_s", "server_drain_s", "exit_s")

FULL = {"connections": 1_000, "repetitions": 5}
QUICK = {"connections": 50, "repetitions": 1}
# The scale case, measured after the first unless a case is chosen.
SCALE = {"connections": 5_000, "repetitions": 3}
QUICK_SCALE = {"connections": 100, "repetitions": 1}

CONNECT_AT_ONCE = 100  # clients opening their connection at the same time
TIMEOUT = 120.0  # a bound against hangs, far above any expected time


def raise_open_file_limit(connections: int) -> int:
    """Raise the soft RLIMIT_NOFILE for this process and the servers it starts.

    Returns the soft limit. Raises RuntimeError if the hard limit is too low.
    """
    needed = connections + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise RuntimeError(
                f"{connections} connections need about {needed} open files, but "
                f"the hard limit (ulimit -Hn) is {hard}"
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
        soft = needed
    return soft


class ServerProcess:
    """A server started for one measurement, with its stderr collected."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self._new_line = asyncio.Event()
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.process.stderr is not None
        async for line in self.process.stderr:
            self.lines.append(line.decode().rstrip("\n"))
            self._new_line.set()
        self._new_line.set()

    async def wait_for(self, pattern: str) -> re.Match[str]:
        while True:
            for line in self.lines:
                if match := re.search(pattern, line):
                    return match
            if self._reader.done():
                raise RuntimeError(
                    f"the server ended without logging {pattern!r}:\n"
                    + "\n".join(self.lines)
                )
            self._new_line.clear()
            await self._new_line.wait()


async def open_client(url: str, index: int) -> ClientConnection:
    """Connect, and check the protocol with one request of no work."""
    ws = await connect(url, ping_interval=None, open_timeout=TIMEOUT)
    await ws.send(json.dumps({"id": index, "work_ms": 0}))
    answer = json.loads(await ws.recv())
    if answer != {"id": index}:
        raise RuntimeError(f"expected {{'id': {index}}}, got {answer!r}")
    return ws


async def wait_closed(ws: ClientConnection) -> tuple[float, int | None, bool]:
    """Wait for the server to close; return when, the close code, and cleanness."""
    try:
        await ws.recv()
    except ConnectionClosedOK:
        clean = True
    except Exception:  # ConnectionClosedError, or a message nobody sent
        clean = False
    else:
        clean = False
    await ws.wait_closed()  # the TCP connection is closed too
    code = None if ws.close_code is None else int(ws.close_code)
    return time.perf_counter(), code, clean


async def measure_once(kind: str, connections: int) -> dict[str, Any]:
    """Start a server, connect the clients, signal it, time the drain."""
    spec = SERVERS[kind]
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(spec.script),
        "--port",
        "0",
        *spec.options,
        stderr=asyncio.subprocess.PIPE,
    )
    server = ServerProcess(process)
    clients: list[ClientConnection] = []
    try:
        url = (await server.wait_for(r"listening on (ws://\S+)")).group(1)
        limit = asyncio.Semaphore(CONNECT_AT_ONCE)

        async def connect_one(index: int) -> ClientConnection:
            async with limit:
                return await open_client(url, index)

        clients = list(
            await asyncio.gather(*(connect_one(i) for i in range(connections)))
        )
        waiting = [asyncio.ensure_future(wait_closed(ws)) for ws in clients]
        started = time.perf_counter()
        process.send_signal(signal.SIGTERM)
        ends = await asyncio.gather(*waiting)
        all_closed = max(end for end, _, _ in ends) - started
        await process.wait()
        exited = time.perf_counter() - started
        drained = float((await server.wait_for(spec.drained)).group(1))
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        for ws in clients:
            await ws.close()
    return {
        "all_closed_s": all_closed,
        "exit_s": exited,
        "server_drain_s": drained,
        "exit_status": process.returncode,
        "close_codes": Counter(code for _, code, _ in ends),
        "clean": sum(clean for _, _, clean in ends),
    }


def summarize(samples: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
    }


async def measure(connections: int, repetitions: int) -> dict[str, Any]:
    samples: dict[str, list[dict[str, Any]]] = {kind: [] for kind in SERVERS}
    kinds = list(SERVERS)
    for repetition in range(repetitions):
        # Alternate which server goes first, so that drifts hit both alike.
        start = repetition % len(kinds)
        for kind in kinds[start:] + kinds[:start]:
            samples[kind].append(
                await asyncio.wait_for(measure_once(kind, connections), TIMEOUT)
            )
    servers: dict[str, Any] = {}
    for kind, runs in samples.items():
        codes: Counter[int | None] = Counter()
        for run_ in runs:
            codes.update(run_["close_codes"])
        servers[kind] = {
            "label": SERVERS[kind].label,
            **{key: summarize([run_[key] for run_ in runs]) for key in MEASURES},
            "close_codes": {str(code): n for code, n in sorted(codes.items())},
            "clean_closes": sum(run_["clean"] for run_ in runs),
            "closes_expected": connections * repetitions,
            "exit_statuses": sorted({run_["exit_status"] for run_ in runs}),
        }
    ratios = {
        baseline: {
            key: statistics.median(
                ours[key] / theirs[key]
                for ours, theirs in zip(
                    samples["trio_graceful"], samples[baseline], strict=True
                )
            )
            for key in MEASURES
        }
        for baseline in BASELINES
    }
    return {"servers": servers, "ratios_of_trio_graceful_to": ratios}


def measure_case(connections: int, repetitions: int) -> dict[str, Any]:
    """Every server drains ``connections`` idle connections, ``repetitions`` times."""
    open_files = raise_open_file_limit(connections)
    results = asyncio.run(measure(connections, repetitions))
    return {
        "connections": connections,
        "repetitions": repetitions,
        "open_file_limit": open_files,
        **results,
    }


def run(
    *,
    quick: bool = False,
    connections: int | None = None,
    repetitions: int | None = None,
) -> dict[str, Any]:
    """Run the benchmark; return its results as a JSON-ready dict.

    The first case is at the top level of the results; the scale case, if
    measured, is under ``"scale"``.
    """
    chosen = connections is not None or repetitions is not None
    settings = QUICK if quick else FULL
    connections = settings["connections"] if connections is None else connections
    repetitions = settings["repetitions"] if repetitions is None else repetitions
    if connections < 1:
        raise ValueError(f"connections must be >= 1, not {connections}")
    if repetitions < 1:
        raise ValueError(f"repetitions must be >= 1, not {repetitions}")
    first = measure_case(connections, repetitions)
    scale = None if chosen else measure_case(**(QUICK_SCALE if quick else SCALE))
    return {"title": TITLE, "grace_s": GRACE, **first, "scale": scale}


def cases(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The cases measured: the first, then the scale case if there is one."""
    return [result] if result["scale"] is None else [result, result["scale"]]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


def table_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for server in result["servers"].values():
        rows.append(
            [
                server["label"],
                *(_ms(server[key]["median"]) for key in MEASURES),
                f"{server['clean_closes']:,} of {server['closes_expected']:,}",
                ", ".join(f"{n:,}x {c}" for c, n in server["close_codes"].items()),
            ]
        )
    for baseline, ratio in result["ratios_of_trio_graceful_to"].items():
        rows.append(
            [
                f"ratio trio_graceful / {baseline} (median of paired runs)",
                *(f"{ratio[key]:.2f}x" for key in MEASURES),
                "",
                "",
            ]
        )
    return rows


COLUMNS = [
    "server",
    "signal → all clients closed",
    "drain (server's log)",
    "signal → exit",
    "clean closes",
    "close codes",
]


def tables(result: dict[str, Any]) -> list[_common.Table]:
    """The results as tables of the benchmark suite's report: one per case."""
    return [
        _common.Table(
            title=f"{TITLE} ({case['connections']:,} connections)",
            columns=COLUMNS,
            rows=table_rows(case),
            notes=[
                f"Medians of {_common.plural(case['repetitions'], 'run')} per "
                "server; every time is counted from the SIGTERM.",
                "The server's own drain time starts when it handles the signal "
                "(the example logs it to the millisecond).",
            ],
        )
        for case in cases(result)
    ]


def goals(result: dict[str, Any]) -> list[_common.Goal]:
    """Per case: clean closes, well within the grace, no slower than websockets."""
    found = []
    for case in cases(result):
        ours = case["servers"]["trio_graceful"]
        expected = ours["closes_expected"]
        clean = ours["clean_closes"] == expected and ours["close_codes"] == {
            "1001": expected
        }
        item = f"6. {case['connections']:,} idle WebSocket connections drained"
        found.append(
            _common.Goal(
                item=item,
                target="every one: CLOSE 1001, the client's CLOSE, TCP close; exit 0",
                measured=f"{ours['clean_closes']:,} of {expected:,} clean, exit "
                + ", ".join(map(str, ours["exit_statuses"])),
                met=clean and ours["exit_statuses"] == [0],
            )
        )
        slowest = ours["all_closed_s"]["max"]
        found.append(
            _common.Goal(
                item=f"{item}: well within --grace {result['grace_s']:g}, "
                "signal to all clients closed, slowest run",
                target=f"< {_common.fmt_seconds(result['grace_s'] / 2)} "
                "(half the grace)",
                measured=_common.fmt_seconds(slowest),
                met=slowest < result["grace_s"] / 2,
            )
        )
        ratio = case["ratios_of_trio_graceful_to"]["websockets"]
        found.append(
            _common.Goal(
                item=f"{item}: signal to all clients closed, vs the websockets server",
                target="≤ 1.00x",
                measured=f"{_common.fmt_ratio(ratio['all_closed_s'])} (drain "
                f"{_common.fmt_ratio(ratio['server_drain_s'])}, exit "
                f"{_common.fmt_ratio(ratio['exit_s'])})",
                met=ratio["all_closed_s"] <= 1.0,
            )
        )
    return found


def main(argv: list[str] | None = None) -> None:
    parser = _cli.argument_parser(__doc__, gc_option=False)
    parser.add_argument(
        "--connections",
        type=int,
        help=f"measure this many idle connections only (default "
        f"{FULL['connections']:,}, then {SCALE['connections']:,})",
    )
    parser.add_argument(
        "--repetitions",
        type=int,
        help=f"runs per server; measure one case only (default "
        f"{FULL['repetitions']}, then {SCALE['repetitions']})",
    )
    args = parser.parse_args(argv)
    result = run(
        quick=args.quick, connections=args.connections, repetitions=args.repetitions
    )
    _cli.print_results(__name__, result)


if __name__ == "__main__":
    main()
