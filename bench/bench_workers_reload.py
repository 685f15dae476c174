"""Several worker processes: what each server loses at a reload, and what it serves.

The same Starlette app (``bench/asgi_app.py``) served by worker processes
under each server, each started as an operator would:

* ``python -m trio_graceful.asgi asgi_app:app --workers 2 --grace 5``;
* ``uvicorn asgi_app:app --workers 2 --timeout-graceful-shutdown 5``;
* ``gunicorn -k uvicorn_worker.UvicornWorker -w 2 --graceful-timeout 5``;
* ``hypercorn --worker-class trio --workers 2 --graceful-timeout 5 asgi_app:app``;
* ``granian --interface asgi --workers 2 --workers-kill-timeout 5``.

**Reloads.** N keep-alive clients (raw HTTP/1.1 on Trio, in this process;
every fourth one pipelines 2 or 3 requests at once) send ``GET /work`` of 20
to 200 ms, each reconnecting when its connection closes. The server gets
SIGHUP every 3 s, five times, then serves 3 s more and gets SIGTERM.
Counted: requests the server had *received* (TCP-exact, see
``_asgi_clients``) and never answered (*dropped*), connections refused and
reset, answers other than 200, and requests sent as the server's FIN came (a
client may send them again). For trio_graceful, each reload's duration comes
from its log (``reload N started`` to ``reload N done``).

**Throughput.** 32 keep-alive clients send ``GET /cpu?ms=1`` (1 ms of CPU
each), 8 pipelined at a time, for `THROUGHPUT_S` seconds, after a warm-up,
to the server with 1 worker, with 2, and with 2 again with the connections
opened at once (a *burst*; otherwise 20 ms apart). Counted: requests per
second; each worker's part of the answers (the app's ``x-pid`` header);
the CPU time of the whole server (its main process and its workers) per
request, and of its main process (the supervisor) per second, from
``/proc/PID/stat``. The clients run on the same machine, and take CPU from
the workers. A full run goes `ROUNDS` times round the servers, so that a
change in the machine's load falls on all of them alike, and reports
medians with their ranges; the ratio of 2 workers to 1 is taken within
each round.

Gunicorn with uvicorn-worker and Granian are not the project's
dependencies: install them in a venv of the bench's own that also sees the
project's, and name its interpreter with ``--peers-python``::

    python -m venv /tmp/bench-peers
    /tmp/bench-peers/bin/pip install gunicorn uvicorn-worker granian starlette
    python -c "import site; print(site.getsitepackages()[0])" \
        > /tmp/bench-peers/lib/python3.11/site-packages/project.pth

Run ``python bench/bench_workers_reload.py [--quick] [--clients 40,200]
[--servers trio_graceful,uvicorn,gunicorn,hypercorn,granian]
[--peers-python PATH] [--rounds 3] [--output FILE]``; it prints one line
per run and writes the results as JSON
(``bench/results/workers_reload.json`` by default) and as tables (the same
name, ``.rst``). ``--quick`` is 8 clients, two reloads and one round of
one-second throughput, trio_graceful only. ``bench/run_all.py`` runs it
too (``workers_reload``), with the servers this interpreter has.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import functools
import itertools
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import _common
import trio
from _asgi_clients import BENCH, ClientConnection, Stale
from _common import load_average
from _rolling import running

GRACE = 5.0
WORK_MS = (20, 200)
PIPELINE = (2, 3)
RELOAD_EVERY = 3.0
TIMEOUT = 180.0  # a bound against hangs, far above any expected time
THROUGHPUT_CLIENTS = 32
THROUGHPUT_S = 8.0
WARM_UP_S = 2.0
CPU_MS = 1
RESULTS = BENCH / "results" / "workers_reload.json"
ROUNDS = 3
"""Throughput rounds of a full run: each server with 1 worker, 2, and 2 in a burst."""
SCALING_GOAL = 1.8
"""Requests per second of 2 workers over 1 that the issue asks of trio_graceful."""

COMMANDS = {
    "trio_graceful": (
        *("-m", "trio_graceful.asgi", "asgi_app:app", "--bind", "127.0.0.1:{port}"),
        *("--workers", "{workers}", "--grace", f"{GRACE:g}"),
    ),
    "uvicorn": (
        *("-m", "uvicorn", "asgi_app:app", "--host", "127.0.0.1", "--port", "{port}"),
        *("--workers", "{workers}", "--timeout-graceful-shutdown", f"{GRACE:g}"),
        "--no-access-log",
    ),
    "gunicorn": (
        *("-m", "gunicorn", "-k", "uvicorn_worker.UvicornWorker", "-w", "{workers}"),
        *("-b", "127.0.0.1:{port}", "--graceful-timeout", f"{GRACE:g}"),
        "asgi_app:app",
    ),
    "hypercorn": (
        *("-m", "hypercorn", "--worker-class", "trio", "--workers", "{workers}"),
        *("--bind", "127.0.0.1:{port}", "--graceful-timeout", f"{GRACE:g}"),
        "asgi_app:app",
    ),
    "granian": (
        *("-m", "granian", "--interface", "asgi", "--workers", "{workers}"),
        *("--host", "127.0.0.1", "--port", "{port}", "--no-ws"),
        *("--workers-kill-timeout", f"{GRACE:g}", "asgi_app:app"),
    ),
}
DISTRIBUTIONS = {
    "trio_graceful": "trio-graceful",
    "uvicorn": "uvicorn",
    "gunicorn": "gunicorn",
    "hypercorn": "hypercorn",
    "granian": "granian",
}
PEERS = frozenset({"gunicorn", "granian"})
"""Servers run by ``--peers-python``, the others by this interpreter."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_serving(port: int) -> None:
    """Poll until the server answers a request (this is a benchmark, not a test)."""
    while True:
        try:
            connection = await ClientConnection.open(port)
        except OSError:
            await trio.sleep(0.1)
            continue
        try:
            await connection.send([(0, 0)])
            answer = await connection.receive()
        except Stale:
            answer = None
        await connection.aclose()
        if answer is not None and answer.status == 200:
            return
        await trio.sleep(0.1)


class Books:
    def __init__(self) -> None:
        self.counts = dict.fromkeys(
            ("sent", "answered", "dropped", "refused", "reset", "not_200", "after_fin"),
            0,
        )
        self.stopping = trio.Event()

    async def client(self, index: int, port: int) -> None:
        rng = random.Random(index)
        ids = itertools.count(1)
        while not self.stopping.is_set():
            try:
                connection = await ClientConnection.open(port)
            except OSError:
                self.counts["refused"] += 1
                await trio.sleep(0.05)
                continue
            await self._converse(connection, index % 4 == 3, rng, ids)
            await connection.aclose()
            counts = self.counts
            counts["sent"] += connection.sent
            counts["answered"] += len(connection.answers)
            counts["dropped"] += connection.dropped
            counts["after_fin"] += connection.sent_after_fin
            counts["reset"] += connection.ended == "reset"
            counts["not_200"] += sum(a.status != 200 for a in connection.answers)

    async def _converse(
        self,
        connection: ClientConnection,
        pipelining: bool,
        rng: random.Random,
        ids: itertools.count[int],
    ) -> None:
        while not self.stopping.is_set():
            size = rng.randint(*PIPELINE) if pipelining else 1
            batch = [(next(ids), rng.randint(*WORK_MS)) for _ in range(size)]
            try:
                await connection.send(batch)
            except Stale:
                return
            while connection.outstanding:
                answer = await connection.receive()
                if answer is None:
                    return
                if answer.close:
                    await connection.wait_closed()
                    return


def command_line(kind: str, python: str, port: int, workers: int) -> list[str]:
    parts = COMMANDS[kind]
    return [python, *(part.format(port=port, workers=workers) for part in parts)]


async def measure(
    kind: str, python: str, clients: int, reloads: int
) -> dict[str, object]:
    port = free_port()
    command = command_line(kind, python, port, 2)
    books = Books()
    with trio.fail_after(TIMEOUT):
        async with running(
            kind,
            command,
            cwd=BENCH,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        ) as server:
            await wait_serving(port)
            async with trio.open_nursery() as nursery:
                for index in range(clients):
                    nursery.start_soon(books.client, index, port)
                for _ in range(reloads):
                    await trio.sleep(RELOAD_EVERY)
                    server.process.send_signal(signal.SIGHUP)
                await trio.sleep(RELOAD_EVERY)
                books.stopping.set()
            server.process.send_signal(signal.SIGTERM)
            status = await server.process.wait()
            lines = list(server.lines)
    return {
        "server": kind,
        "clients": clients,
        "reloads": reloads,
        **books.counts,
        "exit": status,
        "reload_s": reload_durations(lines),
    }


# -- throughput -------------------------------------------------------------------

CPU_REQUEST = f"GET /cpu?ms={CPU_MS} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
CONNECT_EVERY = 0.02
"""Seconds between two throughput clients' connections."""
PIPELINE_DEPTH = 8
"""Requests a throughput client sends at once: the client's cost per request
shrinks, and leaves the CPU to the workers."""


async def cpu_client(port: int, counts: collections.Counter[str]) -> None:
    """Send ``GET /cpu`` in pipelined batches; count the answers in ``counts``,
    by the process that answered (the ``x-pid`` header).

    A connection the server closes (Hypercorn does after 1000 requests) is
    opened again.
    """
    while True:
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            while await _cpu_batch(stream, counts):
                pass


async def _cpu_batch(
    stream: trio.SocketStream, counts: collections.Counter[str]
) -> bool:
    await stream.send_all(CPU_REQUEST * PIPELINE_DEPTH)
    buffer = b""
    waiting = PIPELINE_DEPTH
    while waiting:
        head, found, rest = buffer.partition(b"\r\n\r\n")
        if found:
            length = re.search(rb"(?i)content-length: *(\d+)", head)
            size = int(length.group(1)) if length else 0
            if len(rest) >= size:
                assert head.startswith(b"HTTP/1.1 200"), head
                buffer = rest[size:]
                waiting -= 1
                pid = re.search(rb"(?i)x-pid: *(\d+)", head)
                counts[pid.group(1).decode() if pid else ""] += 1
                if re.search(rb"(?i)connection: *close", head):
                    return False
                continue
        chunk = await stream.receive_some(65536)
        if not chunk:
            return False
        buffer += chunk
    return True


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) the process ``pid`` has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> dict[int, float]:
    """The CPU time of ``pid`` and of each of its children (the workers), by pid."""
    pids = [pid]
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text() if entry.isdigit() else ""
        except OSError:
            continue  # ended meanwhile
        if stat and int(stat.rpartition(")")[2].split()[1]) == pid:
            pids.append(int(entry))
    times: dict[int, float] = {}
    for member in pids:
        try:
            times[member] = cpu_seconds(member)
        except OSError:
            continue
    return times


async def throughput(
    kind: str, python: str, workers: int, seconds: float, *, burst: bool = False
) -> dict[str, object]:
    """Serve the CPU clients for ``seconds``; with ``burst``, all connected at once."""
    port = free_port()
    command = command_line(kind, python, port, workers)
    counts: collections.Counter[str] = collections.Counter()
    with trio.fail_after(TIMEOUT):
        async with running(
            kind,
            command,
            cwd=BENCH,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        ) as server:
            await wait_serving(port)
            async with trio.open_nursery() as nursery:
                for _ in range(THROUGHPUT_CLIENTS):
                    nursery.start_soon(cpu_client, port, counts)
                    # Spread in time, each worker that is idle may take some;
                    # a burst shows whether one worker takes it all.
                    await trio.sleep(0 if burst else CONNECT_EVERY)
                await trio.sleep(min(WARM_UP_S, seconds))
                before, cpu_before = counts.copy(), tree_cpu_seconds(server.process.pid)
                started = trio.current_time()
                await trio.sleep(seconds)
                by_worker = counts - before
                answered = by_worker.total()
                elapsed = trio.current_time() - started
                cpu_after = tree_cpu_seconds(server.process.pid)
                used = {
                    pid: cpu_after[pid] - cpu_before[pid]
                    for pid in cpu_after.keys() & cpu_before.keys()
                }
                supervisor = used.get(server.process.pid, 0.0)
                nursery.cancel_scope.cancel()
            server.process.send_signal(signal.SIGTERM)
            await server.process.wait()
    return {
        "server": kind,
        "workers": workers,
        "burst": burst,
        "requests": answered,
        "per_second": round(answered / elapsed, 1),
        # Each worker's part of the answers, largest first.
        "worker_shares": [
            round(n / max(answered, 1), 3) for _, n in by_worker.most_common()
        ],
        "supervisor_cpu_ms_per_1000": round(supervisor * 1e6 / max(answered, 1), 2),
        # The whole server (its main process and its workers): what a request
        # costs, and how many of the cores it got.
        "server_cpu_ms_per_request": round(
            sum(used.values()) * 1e3 / max(answered, 1), 3
        ),
        "server_cores": round(sum(used.values()) / elapsed, 2),
        "supervisor_cpu_ms_per_s": round(supervisor * 1e3 / elapsed, 2),
        "load_average": load_average(),
    }


# -- the run ---------------------------------------------------------------------


def version(kind: str, python: str) -> str | None:
    """The version of ``kind``'s distribution that ``python`` imports; None if none."""
    code = f"import importlib.metadata as m; print(m.version({DISTRIBUTIONS[kind]!r}))"
    done = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() if done.returncode == 0 else None


def render(results: dict[str, Any]) -> str:
    """The results as reStructuredText tables, for docs/performance.rst."""
    return "\n".join(
        _table(tuple(table.columns), [tuple(row) for row in table.rows])
        for table in tables(results)
    )


def tables(results: dict[str, Any]) -> list[_common.Table]:
    """The reload table and the throughput table (medians of the rounds)."""
    versions = results["versions"]

    def name(kind: str) -> str:
        return f"{kind} {versions[kind]}"

    reload_rows = []
    for row in results["reloads"]:
        seconds = row["reload_s"]
        reload_rows.append(
            [
                name(row["server"]),
                str(row["clients"]),
                f"{row['answered']:,}",
                *(str(row[key]) for key in ("dropped", "refused", "reset", "not_200")),
                f"{min(seconds):g}-{max(seconds):g}" if seconds else "",
            ]
        )
    throughput_rows = []
    for kind, runs in _throughput_runs(results).items():
        one, two, burst = runs["1"], runs["2"], runs["2 burst"]
        throughput_rows.append(
            [
                name(kind),
                _spread([row["per_second"] for row in one], "{:,.0f}"),
                _spread([row["per_second"] for row in two], "{:,.0f}"),
                _spread(_ratios(one, two), "{:.2f}x"),
                _spread([row["per_second"] for row in burst], "{:,.0f}"),
                _spread([_busiest(row) for row in two], "{:.0%}")
                + " / "
                + _spread([_busiest(row) for row in burst], "{:.0%}"),
                _spread([row["server_cpu_ms_per_request"] for row in one], "{:.2f}")
                + " / "
                + _spread([row["server_cpu_ms_per_request"] for row in two], "{:.2f}"),
                _spread([row["supervisor_cpu_ms_per_s"] for row in two], "{:g}"),
            ]
        )
    rounds = results.get("rounds", 1)
    return [
        _common.Table(
            title="Reloads of two worker processes",
            columns=[
                *("Server, 2 workers", "clients", "answered", "dropped"),
                *("refused", "reset", "non-200", "reload s"),
            ],
            rows=reload_rows,
        ),
        _common.Table(
            title=f"Requests per second, GET /cpu ({CPU_MS} ms of CPU)",
            columns=[
                f"Server, GET /cpu ({CPU_MS} ms of CPU)",
                "req/s, 1 worker",
                "req/s, 2 workers",
                "2 / 1",
                "2 workers, burst",
                "busiest worker",
                "server CPU ms / req",
                "supervisor CPU ms / s",
            ],
            rows=throughput_rows,
            notes=[
                f"Medians of {_common.plural(rounds, 'round')}, run in turn, the "
                "range in parentheses; 2 / 1 is the ratio within each round. "
                "Burst: the 32 connections opened at once. Busiest worker: its "
                "part of the answers with 2 workers (connections spread / "
                "burst). Server CPU: the main process and its workers, per "
                "request (1 worker / 2 workers)."
            ],
        ),
    ]


def goals(results: dict[str, Any]) -> list[_common.Goal]:
    """trio_graceful: nothing lost at a reload; two workers serve 1.8x one."""
    ours = [row for row in results["reloads"] if row["server"] == "trio_graceful"]
    lost = {
        key: sum(row[key] for row in ours)
        for key in ("dropped", "refused", "reset", "not_200")
    }
    runs = _throughput_runs(results).get("trio_graceful")
    result = [
        _common.Goal(
            item=f"11. reloads of 2 workers, {_common.plural(len(ours), 'run')}: "
            "dropped, refused, reset, non-200",
            target="0/0/0/0",
            measured="/".join(str(n) for n in lost.values()),
            met=bool(ours) and not any(lost.values()),
        )
    ]
    if runs:
        ratios = _ratios(runs["1"], runs["2"])
        result.append(
            _common.Goal(
                item=f"11. requests/s of 2 workers over 1, GET /cpu ({CPU_MS} ms "
                "of CPU), median of the rounds",
                target=f"≥ {SCALING_GOAL:.2f}x",
                measured=_spread(ratios, "{:.2f}x"),
                met=statistics.median(ratios) >= SCALING_GOAL,
            )
        )
    return result


def _throughput_runs(results: dict[str, Any]) -> dict[str, dict[str, list[Any]]]:
    """Server -> ``"1"``, ``"2"``, ``"2 burst"`` -> its rows, in round order."""
    runs: dict[str, dict[str, list[Any]]] = {}
    for row in results["throughput"]:
        key = f"{row['workers']}{' burst' if row.get('burst') else ''}"
        server = runs.setdefault(row["server"], {"1": [], "2": [], "2 burst": []})
        server[key].append(row)
    return runs


def _ratios(one: list[dict[str, Any]], two: list[dict[str, Any]]) -> list[float]:
    """2 workers over 1, round by round."""
    pairs = zip(one, two, strict=True)
    return [b["per_second"] / a["per_second"] for a, b in pairs if a["per_second"]]


def _busiest(row: dict[str, Any]) -> float:
    shares = row.get("worker_shares") or [0.0]
    return float(shares[0])


def _spread(values: list[float], form: str) -> str:
    """The median, and the range if the values differ: ``1,031 (980-1,100)``."""
    if not values:
        return ""
    median = form.format(statistics.median(values))
    low, high = form.format(min(values)), form.format(max(values))
    return median if low == high else f"{median} ({low}-{high})"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    columns = zip(header, *rows, strict=True)
    widths = [max(len(cell) for cell in column) for column in columns]
    lines = [rule := "  ".join("=" * width for width in widths)]
    for row in (header, *rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    lines.insert(2, rule)
    return "\n".join([*(line.rstrip() for line in lines), rule, ""])


def reload_durations(lines: list[str]) -> list[float]:
    """Each trio_graceful reload's duration, from its log's times."""
    begins: dict[str, float] = {}
    durations: list[float] = []
    for line in lines:
        match = re.match(
            r"\S+ (\d+):(\d+):([\d.,]+) .*reload (\d+) (started|done)", line
        )
        if match is None:
            continue
        hours, minutes, seconds, number, what = match.groups()
        at = int(hours) * 3600 + int(minutes) * 60 + float(seconds.replace(",", "."))
        if what == "started":
            begins[number] = at
        else:
            durations.append(round(at - begins[number], 2))
    return durations


def run(
    *,
    quick: bool = False,
    clients: list[int] | None = None,
    servers: list[str] | None = None,
    peers_python: str = sys.executable,
    rounds: int | None = None,
) -> dict[str, Any]:
    """Run the benchmark; return its results as a JSON-ready dict.

    Servers that are not installed (for ``peers_python`` if they are
    `PEERS`, for this interpreter otherwise) are left out, and named in
    ``missing``. The throughput runs go round by round, each server with 1
    worker, 2, and 2 with a burst of connections, so that a change in the
    machine's load falls on all of them alike.
    """
    clients = [8] if quick else clients or [40, 200]
    servers = ["trio_graceful"] if quick else servers or list(COMMANDS)
    reloads = 2 if quick else 5
    seconds = 1.0 if quick else THROUGHPUT_S
    rounds = 1 if quick else rounds or ROUNDS
    pythons = {
        kind: peers_python if kind in PEERS else sys.executable for kind in servers
    }
    found = {kind: version(kind, python) for kind, python in pythons.items()}
    versions = {kind: found for kind, found in found.items() if found is not None}
    results: dict[str, Any] = {
        "schema": 1,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "mode": "quick" if quick else "full",
        "machine": {"logical_cpus": os.cpu_count(), "load_average": load_average()},
        "versions": versions,
        "missing": [kind for kind in servers if kind not in versions],
        "rounds": rounds,
        "reloads": [],
        "throughput": [],
    }
    for count in clients:
        for kind in versions:
            row = trio.run(measure, kind, pythons[kind], count, reloads)
            print(row, file=sys.stderr, flush=True)
            results["reloads"].append(row)
    for number in range(rounds):
        for kind in versions:
            for workers, burst in ((1, False), (2, False), (2, True)):
                row = trio.run(
                    functools.partial(throughput, burst=burst),
                    kind,
                    pythons[kind],
                    workers,
                    seconds,
                )
                row["round"] = number
                print(row, file=sys.stderr, flush=True)
                results["throughput"].append(row)
    results["machine"]["load_average_after"] = load_average()
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--clients", default="40,200")
    parser.add_argument("--servers", default=",".join(COMMANDS))
    parser.add_argument("--peers-python", default=sys.executable)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    results = run(
        quick=args.quick,
        clients=[int(n) for n in args.clients.split(",")],
        servers=args.servers.split(","),
        peers_python=args.peers_python,
        rounds=args.rounds,
    )
    if results["missing"]:
        parser.error(
            f"not installed: {', '.join(results['missing'])} (see --peers-python)"
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    args.output.with_suffix(".rst").write_text(render(results))


if __name__ == "__main__":
    main()
