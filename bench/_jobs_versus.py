"""trio_graceful.jobs against procrastinate and pgqueuer, on one PostgreSQL.

``python bench/bench_jobs.py --peers`` runs it (see `run`). For each case
(no-op or 1 ms jobs; 1 or 4 worker processes; concurrency 1 or 10 per
process) every library runs the same number of jobs, in rounds interleaved
as `_common.schedule` orders them (each library first in turn). A round:

1. the library's tables are emptied and the jobs queued, each library in a
   database of its own on the same server (the queue is filled without
   waiting for the disk: it is not what is measured);
2. the server's counters are read once no connection to that database is
   left: commits of the database (``pg_stat_database.xact_commit``) and
   WAL flushes of the server (``pg_stat_wal.wal_sync``, the ``fdatasync``
   calls; and ``wal_write``);
3. the worker processes start, connect and say they are ready; then all are
   told "go" at once;
4. a watcher counts the ended jobs in the library's own table every 20 ms
   (its queries are one transaction each, and are taken off the count of
   commits) until all have ended, durably as each library records it;
5. the workers get SIGTERM, stop as their library stops them, and print
   when their first job started and their last job ended;
6. once every connection has closed (a backend's counters are flushed when
   it exits), the counters are read again.

CPU time is read from ``/proc`` between "go" and the moment the watcher
has seen every job end: each worker process's, and the server's (the
processes ``pg_stat_activity`` lists, but the watcher's backend and the
bench's own; the server must run on this machine). Over the jobs, it is
what a job costs the worker and the server; on two cores, their sum
bounds the rate.

The rate is the jobs over the time from the first job's start, in any
process, to the last job's end; the counts per job are the differences of
step 6 and step 2, over the jobs, start-up and shut-down of the workers
included (a few transactions over the round's jobs). WAL flushes are the
server's: its background writer's, and any other database's, would count
too, but nothing else runs on this server.

On SQLite only trio_graceful runs (neither peer has a SQLite store): its
rates, and each concurrency's ratio to concurrency 1 in the same round.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import _jobs_peers
import _postgres
import psycopg
from _common import Table, load_average, machine, schedule
from _jobs_store import TERMINAL, count_ended, queries, reset, submit_many
from _render import markdown_table, rst_table

import trio_graceful

BENCH = Path(__file__).resolve().parent
SCRIPT = BENCH / "bench_jobs.py"
RESULTS = BENCH / "results" / "jobs_peers.json"
TIMEOUT_S = 600.0  # a bound against a hung round, far above any expected time

OURS = "trio_graceful"
PROCRASTINATE = "procrastinate"
PGQUEUER = "pgqueuer"
PGQUEUER_DEFAULTS = "pgqueuer, defaults"
LIBRARY = {
    OURS: OURS,
    PROCRASTINATE: PROCRASTINATE,
    PGQUEUER: PGQUEUER,
    PGQUEUER_DEFAULTS: PGQUEUER,
}
DATABASE = {name: f"bench_{name}" for name in (OURS, PROCRASTINATE, PGQUEUER)}
ENDED = {
    OURS: "SELECT count(*) FROM jobs WHERE state = ANY(%(terminal)s)",
    **_jobs_peers.ENDED,
}


@dataclasses.dataclass(frozen=True)
class Case:
    store: str  # "postgresql" or "sqlite"
    job_ms: float
    processes: int
    concurrency: int

    @property
    def title(self) -> str:
        store = {"postgresql": "PostgreSQL", "sqlite": "SQLite"}[self.store]
        job = "no-op" if not self.job_ms else f"{self.job_ms:g} ms"
        unit = "process" if self.processes == 1 else "processes"
        return f"{store}, {job}, {self.processes} {unit} x {self.concurrency}"

    def variants(self, available: Sequence[str]) -> list[str]:
        """What runs in this case, of the variants whose libraries are installed."""
        if self.store == "sqlite":
            return [OURS]
        wanted = [OURS, PROCRASTINATE, PGQUEUER]
        if self.concurrency > 1:
            # pgqueuer's default is no limit: the same in every case, so
            # measured once per kind of job and number of processes.
            wanted.append(PGQUEUER_DEFAULTS)
        return [v for v in wanted if v in available]


def groups(stores: Sequence[str], *, quick: bool) -> list[list[Case]]:
    """The cases, in groups measured together: concurrency 1 and 10 alike."""
    return [
        [Case(store, job_ms, processes, concurrency) for concurrency in (1, 10)]
        for store in stores
        for job_ms in ((0,) if quick else (0, 1))
        for processes in (1, 4)
    ]


def child_args(variant: str, url: str, case: Case) -> list[str]:
    """The arguments of bench_jobs.py that run one worker process of ``variant``."""
    options = ["--concurrency", str(case.concurrency), "--job-ms", str(case.job_ms)]
    if variant == OURS:
        return ["--child-worker", url, *options]
    if variant == PROCRASTINATE:
        return ["--child-procrastinate", url, *options]
    if variant == PGQUEUER:
        # pgqueuer's limit holds for all its workers together: the slots of
        # all the processes. A batch larger than a process's slots would
        # hold finished jobs' slots until the batch's acknowledgements are
        # flushed (0.1 s at most).
        limit = case.processes * case.concurrency
        return [
            *("--child-pgqueuer", url, *options[2:], "--concurrency", str(limit)),
            *("--batch", str(case.concurrency)),
        ]
    # pgqueuer's defaults: no limit (0), batches of 10
    return ["--child-pgqueuer", url, *options[2:], "--concurrency", "0"]


# -- the server's counters ----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Counters:
    commits: int
    wal_syncs: int
    wal_writes: int


class Server:
    """The PostgreSQL server's counters, read from its ``postgres`` database."""

    def __init__(self, admin_url: str) -> None:
        self._admin = psycopg.connect(admin_url, autocommit=True)

    def close(self) -> None:
        self._admin.close()

    def wait_idle(self, database: str) -> None:
        """Until no connection to ``database`` is left (their counters flushed)."""
        deadline = time.monotonic() + 60
        while self._one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", database
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(f"connections to {database} stay open")
            time.sleep(0.01)

    def counters(self, database: str) -> Counters:
        self.wait_idle(database)
        row = self._admin.execute(
            "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = %s),"
            " wal_sync, wal_write FROM pg_stat_wal",
            (database,),
        ).fetchone()
        assert row is not None
        return Counters(int(row[0]), int(row[1]), int(row[2]))

    def pids(self) -> list[int]:
        """The server's processes but the one serving this connection.

        Its backends and background processes: those of a server on this
        machine, whose CPU time `CpuClock` reads.
        """
        rows = self._admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
        ).fetchall()
        return [int(pid) for (pid,) in rows]

    def _one(self, query: str, *args: object) -> int:
        row = self._admin.execute(query, args).fetchone()
        assert row is not None
        return int(row[0])

    def latencies(self, samples: int = 200) -> dict[str, float]:
        """Median seconds of a round trip and of a durable commit, one at a time.

        ``SELECT 1``, and an INSERT of one row committed on its own (a WAL
        flush each): what a slot waits for between two jobs at least, when
        its next job is claimed in the transaction of its last one's ending.
        """
        table = "bench_commit_latency"
        self._admin.execute(f"CREATE TABLE IF NOT EXISTS {table} (v int)")
        try:
            timed = {
                "round trip": "SELECT 1",
                "durable commit": f"INSERT INTO {table} VALUES (1)",
            }
            medians = {}
            for what, query in timed.items():
                times = []
                for _ in range(samples):
                    started = time.perf_counter()
                    self._admin.execute(query)
                    times.append(time.perf_counter() - started)
                medians[what] = statistics.median(times)
            return medians
        finally:
            self._admin.execute(f"DROP TABLE {table}")

    def version(self) -> str:
        row = self._admin.execute("SHOW server_version").fetchone()
        assert row is not None
        return str(row[0])


# -- CPU time -----------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # The fields after the command's name, which may hold spaces.
            fields = stat.read().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


class CpuClock:
    """The CPU time that processes spend from now on, new ones included."""

    def __init__(self, pids: Sequence[int]) -> None:
        self._start = {pid: cpu_seconds(pid) for pid in pids}

    def spent(self, pids: Sequence[int]) -> float:
        """Seconds spent since the start by ``pids``: all of it for a new one."""
        return sum(cpu_seconds(pid) - self._start.get(pid, 0.0) for pid in pids)


# -- one round ----------------------------------------------------------------


class Watcher:
    """Counts a library's ended jobs, on one connection opened before the clock."""

    def __init__(self, variant: str, url: str, n: int) -> None:
        self.polls = 0
        self.backend: int | None = None  # the server's process serving it
        self._sqlite = url.startswith("sqlite")
        if self._sqlite:
            self._queries = queries(url)
        else:
            self._connection = psycopg.connect(url, autocommit=True)
            self._query = ENDED[LIBRARY[variant]]
            self._args = {"n": n, "terminal": TERMINAL}
            self.backend = self._connection.info.backend_pid

    def ended(self) -> int:
        if self._sqlite:
            return count_ended(self._queries)
        self.polls += 1
        row = self._connection.execute(self._query, self._args).fetchone()
        assert row is not None
        return int(row[0])

    def close(self) -> None:
        if self._sqlite:
            self._queries.close()
        else:
            self._connection.close()


def fill(variant: str, url: str, n: int) -> None:
    """Empty the library's tables, then queue ``n`` no-op jobs."""
    library = LIBRARY[variant]
    if library == OURS:
        reset(url)
        submit_many(url, n)
        return
    with psycopg.connect(url, autocommit=True) as connection:
        tables = connection.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall()
        names = ", ".join(f'"{name}"' for (name,) in tables)
        connection.execute(f"TRUNCATE {names} RESTART IDENTITY CASCADE")
    asyncio.run(_jobs_peers.SUBMIT[library](url, n))
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("ANALYZE")  # as submit_many does for ours


def spawn(args: list[str], stack: contextlib.ExitStack) -> subprocess.Popen[str]:
    """Start a worker process and wait for it to be ready.

    If the round fails, ``stack`` kills and reaps it.
    """
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    stack.callback(_reap, process)
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if line != "ready":
        raise RuntimeError(f"worker {args[0]} said {line!r}, not ready")
    return process


def _reap(process: subprocess.Popen[str]) -> None:
    if process.returncode is None:
        process.kill()
        process.communicate()


def one_round(
    variant: str, case: Case, url: str, n: int, server: Server | None
) -> dict[str, float]:
    """Run ``n`` jobs of ``case`` with ``variant``: the rate and counts per job."""
    fill(variant, url, n)
    database = DATABASE[LIBRARY[variant]]
    before = server.counters(database) if server else None
    with contextlib.ExitStack() as stack:
        args = child_args(variant, url, case)
        workers = [spawn(args, stack) for _ in range(case.processes)]
        watcher = Watcher(variant, url, n)
        stack.callback(watcher.close)
        pids = [worker.pid for worker in workers]
        servers = server.pids() if server is not None else []
        clock = CpuClock([*pids, *servers])
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        deadline = time.monotonic() + TIMEOUT_S
        while watcher.ended() < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{variant}: {case.title}: jobs still running")
            time.sleep(0.02)
        worker_cpu = clock.spent(pids)
        if server is not None:
            others = [pid for pid in server.pids() if pid != watcher.backend]
            server_cpu = clock.spent(others)
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        spans = []
        for worker in workers:
            output = worker.communicate(timeout=60)[0]
            if worker.returncode == -signal.SIGTERM and "span " not in output:
                # Stopped before its library set its handler, so before its
                # first job: when all the jobs end first (a quick run's few).
                # The count below checks that the others ran them all.
                continue
            if worker.returncode != 0:
                raise RuntimeError(f"{variant}: worker exited with {worker.returncode}")
            spans.append(_jobs_peers.read_span(output))
    ran = sum(count for _, _, count in spans)
    if ran != n:
        raise RuntimeError(f"{variant}: {ran} jobs ran, not {n}")
    elapsed = max(last for _, last, _ in spans) - min(first for first, _, _ in spans)
    measured = {"rate": n / elapsed, "worker CPU per job": worker_cpu / n}
    if server is not None and before is not None:
        measured["server CPU per job"] = server_cpu / n
        after = server.counters(database)
        commits = after.commits - before.commits - watcher.polls
        measured["commits per job"] = commits / n
        measured["WAL flushes per job"] = (after.wal_syncs - before.wal_syncs) / n
        measured["WAL writes per job"] = (after.wal_writes - before.wal_writes) / n
    return measured


# -- the run ------------------------------------------------------------------


def measure_group(
    group: Sequence[Case],
    available: Sequence[str],
    urls: dict[str, dict[str, str]],
    n: int,
    rounds: int,
    server: Server | None,
) -> list[dict[str, Any]]:
    """Every variant of every case of ``group``, in interleaved rounds.

    Each round runs every (case, variant) pair once, each pair first in turn:
    a round's ratios compare runs made minutes apart at most.
    """
    pairs = {
        f"{case.title}: {v}": (i, v)
        for i, case in enumerate(group)
        for v in case.variants(available)
    }
    samples: list[dict[str, list[dict[str, float]]]] = [{} for _ in group]
    for _, label in schedule(list(pairs), rounds):
        i, variant = pairs[label]
        case = group[i]
        url = urls[case.store][variant]
        stats = server if case.store == "postgresql" else None
        measured = one_round(variant, case, url, n, stats)
        samples[i].setdefault(variant, []).append(measured)
    return [
        {**dataclasses.asdict(case), "title": case.title, "rounds": samples[i]}
        for i, case in enumerate(group)
    ]


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


STORES = ("postgresql", "sqlite")


def run(
    *,
    quick: bool,
    postgres: str | None,
    output: Path | None,
    stores: Sequence[str] = STORES,
    jobs: int | None = None,
    rounds: int | None = None,
) -> dict[str, Any]:
    """Measure every case; write the results to ``output`` (if given) and print.

    ``postgres``: the URL of a server to use (it gets one database per
    library, dropped first if it exists); without it, one is started.
    """
    n = jobs or (20 if quick else 500)
    rounds = rounds or (1 if quick else 10)
    available = [OURS]
    skipped: dict[str, str] = {}
    for library in (PROCRASTINATE, PGQUEUER):
        reason = _jobs_peers.missing(library)
        if reason is None:
            available.append(library)
            if library == PGQUEUER:
                available.append(PGQUEUER_DEFAULTS)
        else:
            skipped[library] = reason
            print(f"skipped: {reason}", file=sys.stderr)
    results: dict[str, Any] = {
        "mode": "quick" if quick else "full",
        "started": datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%S UTC"
        ),
        "uptime": {"start": uptime()},
        "load_average": {"start": load_average()},
        "machine": machine(),
        "versions": {
            OURS: trio_graceful.__version__,
            PROCRASTINATE: _jobs_peers.version(PROCRASTINATE),
            PGQUEUER: _jobs_peers.version(PGQUEUER),
        },
        "jobs": n,
        "rounds": rounds,
        "skipped": skipped,
        "cases": [],
    }
    urls: dict[str, dict[str, str]] = {
        "sqlite": {OURS: f"sqlite:///{tempfile.mkdtemp()}/bench.db"}
    }
    with contextlib.ExitStack() as stack:
        server: Server | None = None
        if "postgresql" in stores:
            admin_url = stack.enter_context(
                _postgres.started_server()
                if postgres is None
                else contextlib.nullcontext(postgres)
            )
            server = _postgres_setup(admin_url, available)
            stack.callback(server.close)
            results["versions"]["postgresql"] = server.version()
            results["latencies"] = server.latencies()
            urls["postgresql"] = {
                v: _postgres.database_url(admin_url, DATABASE[LIBRARY[v]])
                for v in available
            }
        for group in groups(stores, quick=quick):
            print(", ".join(c.title for c in group), file=sys.stderr, flush=True)
            results["cases"].extend(
                measure_group(group, available, urls, n, rounds, server)
            )
    results["uptime"]["end"] = uptime()
    results["load_average"]["end"] = load_average()
    if output is not None:
        output.write_text(json.dumps(results, indent=1) + "\n")
        output.with_suffix(".rst").write_text(render_rst(results))
    for table in tables(results):
        print(markdown_table(table))
    return results


def _postgres_setup(admin_url: str, available: Sequence[str]) -> Server:
    """A database per library, with its tables; the server's counters."""
    for library in {LIBRARY[v] for v in available}:
        url = _postgres.create_database(admin_url, DATABASE[library])
        if library == OURS:
            reset(url)  # opening the store creates its tables
        else:
            asyncio.run(_jobs_peers.INSTALL[library](url))
    return Server(admin_url)


# -- the report ---------------------------------------------------------------


def _median_range(values: Sequence[float], digits: int = 2) -> str:
    return (
        f"{statistics.median(values):.{digits}f} "
        f"({min(values):.{digits}f}-{max(values):.{digits}f})"
    )


def _paired(case: dict[str, Any], a: str, b: str) -> list[float]:
    """The ratios of ``a``'s rate to ``b``'s, round by round."""
    return [
        x["rate"] / y["rate"]
        for x, y in zip(case["rounds"][a], case["rounds"][b], strict=True)
    ]


def _label(variant: str) -> str:
    if variant == PGQUEUER:
        return "pgqueuer (batch = concurrency)"
    return variant


def tables(results: dict[str, Any]) -> Iterator[Table]:
    postgres = [c for c in results["cases"] if c["store"] == "postgresql"]
    peers = [PROCRASTINATE, PGQUEUER, PGQUEUER_DEFAULTS]
    present = [p for p in peers if any(p in c["rounds"] for c in postgres)]
    versions = results["versions"]
    notes = [
        f"{results['jobs']:,} jobs per round, {results['rounds']} rounds per "
        "case, interleaved. Rates: median jobs/s, from the first job's start "
        "to the last job's end. Ratios: trio_graceful's rate over the peer's in "
        "the same round, median (lowest-highest).",
        "Versions: "
        + ", ".join(f"{k} {v}" for k, v in versions.items() if v is not None)
        + ".",
    ]
    notes.extend(f"Skipped: {reason}." for reason in results["skipped"].values())
    if "latencies" in results:
        trip, commit = (
            results["latencies"][what] * 1e6
            for what in ("round trip", "durable commit")
        )
        notes.append(
            f"The server, before the rounds: a round trip ({trip:.0f} µs) and a "
            f"durable commit of one row ({commit:.0f} µs), medians of 200."
        )
    notes.append(f"uptime at the start: {results['uptime']['start']}")
    notes.append(f"uptime at the end: {results['uptime']['end']}")
    if postgres:
        columns = ["jobs/s", *(_label(v) for v in [OURS, *present])]
        columns += [f"{OURS} / {_label(p)}" for p in present]
        rows = []
        for case in postgres:
            rounds = case["rounds"]
            row = [case["title"]]
            row += [
                f"{statistics.median(s['rate'] for s in rounds[v]):,.0f}"
                if v in rounds
                else "-"
                for v in [OURS, *present]
            ]
            row += [
                _median_range(_paired(case, OURS, p)) if p in rounds else "-"
                for p in present
            ]
            rows.append(row)
        yield Table("Jobs per second on PostgreSQL", columns, rows, notes)
        yield _per_job(
            "WAL flushes and commits per job on PostgreSQL",
            "WAL flushes / commits per job",
            postgres,
            present,
            ("WAL flushes per job", "commits per job"),
            "{:.2f} / {:.2f}",
            "Medians over the rounds: the server's fdatasync calls "
            "(pg_stat_wal.wal_sync) and the database's commits "
            "(pg_stat_database.xact_commit, read-only ones included, the "
            "watcher's taken off), over the jobs, the workers' start-up "
            "and shut-down included.",
        )
        yield _per_job(
            "CPU time per job on PostgreSQL",
            "CPU per job, worker + server",
            postgres,
            present,
            ("worker CPU per job", "server CPU per job"),
            "{:,.0f} + {:,.0f} µs",
            "Medians over the rounds: the user and system CPU time of "
            "the worker processes, and of the server's processes (the "
            'watcher\'s backend left out), from "go" until every job has '
            "ended, over the jobs. On two cores, the rate is at most two "
            "over their sum.",
            scale=1e6,
        )
    sqlite = [c for c in results["cases"] if c["store"] == "sqlite"]
    if sqlite:
        rows = []
        for case in sqlite:
            rates = [s["rate"] for s in case["rounds"][OURS]]
            serial = next(
                c
                for c in sqlite
                if (c["job_ms"], c["processes"], c["concurrency"])
                == (case["job_ms"], case["processes"], 1)
            )
            ratios = [
                s["rate"] / t["rate"]
                for s, t in zip(
                    case["rounds"][OURS], serial["rounds"][OURS], strict=True
                )
            ]
            rows.append([case["title"], _median_range(rates, 0), _median_range(ratios)])
        yield Table(
            "trio_graceful on SQLite",
            ["case", "jobs/s", "/ concurrency 1"],
            rows,
            [
                "The ratio to concurrency 1: to the rate at concurrency 1 with "
                "as many processes in the same round, median (lowest-highest)."
            ],
        )


def _per_job(
    title: str,
    heading: str,
    cases: Sequence[dict[str, Any]],
    peers: Sequence[str],
    measures: tuple[str, str],
    cell: str,
    note: str,
    *,
    scale: float = 1.0,
) -> Table:
    """A table of two ``measures`` per job, their medians in ``cell``."""
    rows = []
    for case in cases:
        rounds = case["rounds"]
        row = [case["title"]]
        for v in [OURS, *peers]:
            if v not in rounds:
                row.append("-")
                continue
            medians = (
                statistics.median(s[what] for s in rounds[v]) * scale
                for what in measures
            )
            row.append(cell.format(*medians))
        rows.append(row)
    return Table(title, [heading, *(_label(v) for v in [OURS, *peers])], rows, [note])


def render_rst(results: dict[str, Any]) -> str:
    head = (
        ".. This file is generated by bench/bench_jobs.py --peers from "
        "jobs_peers.json; do not edit it.\n\n"
    )
    return head + "\n".join(rst_table(t, underline="^") for t in tables(results))
