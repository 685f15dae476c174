"""Durable jobs: throughput, rescue time and cancel latency, on SQLite and PostgreSQL.

* Throughput of claim -> run -> complete for no-op jobs and for jobs of
  1 ms and 10 ms, with 1 and 4 worker processes, against a hand-written loop
  on the same store in the same run (claim, the job's time, complete, through
  the store's own queries: two transactions per job, in one process, no
  Trio, no threads). The library's worker writes the same rows, and commits
  a job's ending with the next claim (one transaction per job in the steady
  state); the ratio is what it adds or saves (a thread for the queries, a
  bundle per job, the supervision of its end). On SQLite the loop also runs
  with SQLite's own busy handler in place of the store's wait for the lock
  (``hand-written, SQLite's busy handler``): with several processes, one of
  them then keeps the lock while the others sleep, which is faster for the
  loop; the table gives the ratio to each. A third loop runs on Trio
  (``hand-written on Trio``): the library's own transaction (a job's ending
  with the next claim), one trip to a worker thread per job, and nothing
  else. The ratio to it is what the library's supervision of each job costs
  (a bundle, its STOP and deadlines, the worker's bookkeeping); its own
  ratio to the first loop is what the thread trip costs, the wake of a
  thread and of Trio each way.
* From a worker's SIGKILL to its job running on another worker (the lease
  is 1 s: most of this time is the lease running out).
* From a cancel request to ``cancelled``: cooperative (the job checks
  between 10 ms steps) and forced (it never checks; ``cancel_grace`` 0.2 s).
* With ``--peers``, and nothing of the above: against procrastinate and
  pgqueuer, each with its documented worker, on a PostgreSQL server the
  bench starts (or ``--postgres URL``), at concurrency 1 and 10 per worker
  process, and on SQLite for trio_graceful alone: see ``_jobs_versus.py``.
  The peers are not dependencies of the project
  (``pip install -r bench/requirements-peers.txt``); without them their
  columns are left out, and the reason printed.

Each throughput is the median of interleaved rounds (7 for no-op jobs, 3
for the others); each ratio is the median of the rounds' own ratios, given
with the lowest and the highest. PostgreSQL is measured when ``--postgres
URL`` is given (an empty database).
``--pin`` keeps each worker process, of every variant, on one CPU (the
library's Trio thread and query thread then share it), and measures
throughput only. Run ``python bench/bench_jobs.py [--quick] [--postgres URL]
[--pin | --peers] [--output FILE]``; a full run's results go to
``bench/results/jobs.json`` (``jobs_pinned.json``; ``jobs_peers.json`` and
its table ``jobs_peers.rst``), a quick run's only to ``--output``; the
tables go to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _render
import trio
from _jobs_peers import Span, pgqueuer_worker, procrastinate_worker
from _jobs_store import count_ended, queries, reset, submit_many

from trio_graceful import open_inbox
from trio_graceful.jobs import (
    JobEvent,
    JobRecord,
    JobState,
    Worker,
    _client,
    _holding,
    open_store,
)
from trio_graceful.jobs._holding import ClaimRequest, GroupedEnding
from trio_graceful.jobs._records import JobEnding

HERE = Path(__file__).resolve().parent
WORKER_ARGS = ["--lease", "1", "--cancel-grace", "0.2"]
EXAMPLE = HERE.parent / "examples" / "jobs_service.py"


BUSY_HANDLER = "hand-written, SQLite's busy handler"
ON_TRIO = "hand-written on Trio"


def library_worker(
    url: str, job_ms: float, *, offload: bool = True, concurrency: int = 1
) -> None:
    """A worker process running jobs of ``job_ms`` from "go" on stdin until SIGTERM.

    With ``offload=False`` the store runs its queries in the Trio thread.
    When stopped, prints its jobs' `Span`.
    """
    span = Span()

    async def noop(ctx: Any) -> None:
        started = time.monotonic()
        if job_ms:
            await trio.sleep(job_ms / 1000)
        span.add(started, time.monotonic())

    async def main() -> None:
        # One job at a time by default, as the hand-written loop runs them:
        # like for like. The default poll interval: jobs are queued before
        # "go", so a claim only comes back empty once the queue is.
        store = open_store(url, offload=offload)
        worker = Worker(store, {"noop": noop}, concurrency=concurrency)
        sender, receiver = open_inbox()
        # Before "ready": a SIGTERM that comes while the worker starts (all
        # the jobs ended by the other processes) waits for it.
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            print("ready", flush=True)
            await trio.to_thread.run_sync(sys.stdin.readline)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.serve, receiver)
                async for _ in signals:
                    sender.stop()
                    break

    trio.run(main)
    span.report()


def hand_written_worker(url: str, job_ms: float, *, busy_handler: bool) -> None:
    """The baseline: claim, wait ``job_ms``, complete, until nothing is left.

    With ``busy_handler``, SQLite waits for the lock itself (the store's
    wait never starts: the statement waits inside SQLite instead).
    """
    q = queries(url)
    if busy_handler:
        q.execute("PRAGMA busy_timeout = 30000")
    name = f"raw-{os.getpid()}"
    print("ready", flush=True)
    sys.stdin.readline()
    while (
        job := _holding.claim(q, name, now=time.time(), lease=30, stale_after=None)
    ) is not None:
        if job_ms:
            time.sleep(job_ms / 1000)
        _holding.finish(q, completion(job, name), now=time.time())
    q.close()


def completion(job: JobRecord, worker: str) -> JobEnding:
    """How the hand-written loops complete ``job``, of ``worker``'s."""
    return JobEnding(
        job_id=job.id,
        event=JobEvent.COMPLETE,
        worker=worker,
        attempt=1,
        reason="done",
        changes={"result": "null"},
    )


def hand_written_trio_worker(url: str, job_ms: float) -> None:
    """The library's transactions and thread trips, without the library.

    Claims, then per job: waits ``job_ms``, and in one trip to a worker
    thread settles the job and claims the next, until nothing is left.
    """
    q = queries(url)
    name = f"trio-{os.getpid()}"
    print("ready", flush=True)
    sys.stdin.readline()

    def settle_then_claim(job: JobRecord) -> JobRecord | None:
        claim = ClaimRequest(
            limit=1, lease=30, stale_after=None, incarnation=None, kinds=None
        )
        ending = GroupedEnding(completion(job, name), time.time(), claim)
        [settled] = _holding.finish_group(q, [ending])
        _, claimed = settled.unwrap()
        return claimed[0] if claimed else None

    async def main() -> None:
        job = await trio.to_thread.run_sync(
            lambda: _holding.claim(q, name, now=time.time(), lease=30, stale_after=None)
        )
        while job is not None:
            if job_ms:
                await trio.sleep(job_ms / 1000)
            job = await trio.to_thread.run_sync(settle_then_claim, job)

    trio.run(main)
    q.close()


def spawn(*args: str, cpu: int | None = None) -> subprocess.Popen[str]:
    where = [] if cpu is None else ["--cpu", str(cpu)]
    process = subprocess.Popen(
        [sys.executable, __file__, *args, *where],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


def throughput(
    url: str,
    variant: str,
    processes: int,
    n: int,
    job_ms: float = 0,
    *,
    pin: bool = False,
) -> float:
    """Jobs per second from "go" to the last of ``n`` queued jobs ending.

    Both variants are measured alike: the jobs are queued and the worker
    processes started and ready before the clock starts, and the end is
    seen by the same count of ended jobs.
    """
    reset(url)
    submit_many(url, n)
    child = {
        "library": "--child-worker",
        "library, offload=False": "--child-inline",
        "hand-written": "--child-raw",
        BUSY_HANDLER: "--child-raw-busy",
        ON_TRIO: "--child-trio",
    }[variant]
    cpus = sorted(os.sched_getaffinity(0))
    workers = [
        spawn(
            child,
            url,
            "--job-ms",
            str(job_ms),
            cpu=cpus[i % len(cpus)] if pin else None,
        )
        for i in range(processes)
    ]
    # One connection, opened before the clock starts, and a light query every
    # 5 ms: the watcher must not load the machine it measures.
    watcher = queries(url)
    t0 = time.perf_counter()
    for w in workers:
        assert w.stdin is not None
        w.stdin.write("go\n")
        w.stdin.flush()
    while count_ended(watcher) < n:
        time.sleep(0.005)
    elapsed = time.perf_counter() - t0
    watcher.close()
    for w in workers:
        if child in ("--child-worker", "--child-inline"):
            w.send_signal(signal.SIGTERM)
        w.communicate()  # waits, and closes its pipes
    return n / elapsed


def example(url: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--store", url, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_for(url: str, job_id: str, condition: Any) -> float:
    q = queries(url)
    try:
        while not condition(q.get(job_id)):
            time.sleep(0.002)
        return time.perf_counter()
    finally:
        q.close()


def submit_cli(url: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--store", url, "submit", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def rescue_and_cancel(url: str, repetitions: int) -> dict[str, list[float]]:
    reset(url)
    times: dict[str, list[float]] = {
        "sigkill to running elsewhere": [],
        "cancel to cancelled, cooperative": [],
        "cancel to cancelled, forced": [],
    }
    for _ in range(repetitions):
        victim = example(url, "worker", "--worker-id", "victim", *WORKER_ARGS)
        job_id = submit_cli(url, "steps", "--steps", "100000", "--step-ms", "10")
        wait_for(url, job_id, lambda j: j.worker == "victim" and j.progress)
        survivor = example(url, "worker", "--worker-id", "survivor", *WORKER_ARGS)
        time.sleep(1.5)  # the survivor is up and polling
        t0 = time.perf_counter()
        victim.kill()
        victim.wait()
        t1 = wait_for(
            url,
            job_id,
            lambda j: j.worker == "survivor" and j.state is JobState.RUNNING,
        )
        times["sigkill to running elsewhere"].append(t1 - t0)
        for kind, label in (("steps", "cooperative"), ("stubborn", "forced")):
            cid = submit_cli(url, kind, "--steps", "100000", "--step-ms", "10")
            wait_for(url, cid, lambda j: j.progress is not None)
            q = queries(url)
            t0 = time.perf_counter()
            _client.request_cancel(q, cid, now=time.time())
            q.close()
            t1 = wait_for(url, cid, lambda j: j.state is JobState.CANCELLED)
            times[f"cancel to cancelled, {label}"].append(t1 - t0)
        q = queries(url)
        _client.request_cancel(q, job_id, now=time.time())
        q.close()
        survivor.send_signal(signal.SIGTERM)
        survivor.wait()
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--postgres", default=None)
    parser.add_argument("--child-worker", default=None)
    parser.add_argument("--child-inline", default=None)
    parser.add_argument("--child-raw", default=None)
    parser.add_argument("--child-raw-busy", default=None)
    parser.add_argument("--child-trio", default=None)
    parser.add_argument("--child-procrastinate", default=None)
    parser.add_argument("--child-pgqueuer", default=None)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument(
        "--jobs", type=int, default=None, help="jobs per round, with --peers"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="rounds per case, with --peers"
    )
    parser.add_argument(
        "--render",
        type=Path,
        metavar="RESULTS_JSON",
        help="measure nothing: write the table (.rst) of a --peers results file",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="measure against procrastinate and pgqueuer (starts its own "
        "PostgreSQL unless --postgres is given)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="the results file (default: bench/results/jobs.json, "
        "jobs_pinned.json or jobs_peers.json for a full run; "
        "a quick run writes none)",
    )
    parser.add_argument("--job-ms", type=float, default=0.0)
    parser.add_argument(
        "--pin",
        action="store_true",
        help="keep each worker process, of every variant, on one CPU",
    )
    parser.add_argument("--cpu", type=int, default=None)
    args = parser.parse_args()
    if args.cpu is not None:
        # Before any thread starts: the threads inherit it.
        os.sched_setaffinity(0, {args.cpu})
    if args.child_worker:
        return library_worker(
            args.child_worker, args.job_ms, concurrency=args.concurrency
        )
    if args.child_procrastinate:
        return procrastinate_worker(
            args.child_procrastinate, args.concurrency, args.job_ms
        )
    if args.child_pgqueuer:
        return pgqueuer_worker(
            args.child_pgqueuer, args.concurrency, args.batch, args.job_ms
        )
    output = args.output
    if args.peers or args.render:
        # Only here: it needs psycopg, which a run on SQLite does not.
        import _jobs_versus

        if args.render:
            _render.render_again(args.render, _jobs_versus.render_rst)
            return None
        if output is None and not args.quick:
            output = _jobs_versus.RESULTS
        _jobs_versus.run(
            quick=args.quick,
            postgres=args.postgres,
            output=output,
            jobs=args.jobs,
            rounds=args.rounds,
        )
        return None
    if args.child_inline:
        return library_worker(args.child_inline, args.job_ms, offload=False)
    if args.child_raw:
        return hand_written_worker(args.child_raw, args.job_ms, busy_handler=False)
    if args.child_raw_busy:
        return hand_written_worker(args.child_raw_busy, args.job_ms, busy_handler=True)
    if args.child_trio:
        return hand_written_trio_worker(args.child_trio, args.job_ms)
    n, reps = (500, 1) if args.quick else (2000, 3)
    stores = {"sqlite": f"sqlite:///{tempfile.mkdtemp()}/bench.db"}
    if args.postgres:
        stores["postgresql"] = args.postgres
    results: dict[str, Any] = {
        "jobs": n,
        "repetitions": {"no-op jobs": 2 * reps + 1, "other jobs": reps},
        "pinned": args.pin,
        "stores": {},
    }
    for name, url in stores.items():
        row: dict[str, Any] = {}
        for job_ms, processes in [(0, 1), (0, 4), (1, 1), (1, 4), (10, 1), (10, 4)]:
            baselines = ["hand-written"]
            if name == "sqlite":
                baselines.append(BUSY_HANDLER)
            baselines.append(ON_TRIO)
            variants = ["library", "library, offload=False", *baselines]
            rates: dict[str, list[float]] = {v: [] for v in variants}
            pairs = [(v, b) for v in variants[:2] for b in baselines]
            pairs.append((ON_TRIO, "hand-written"))
            ratios: dict[str, list[float]] = {f"{v} / {b}": [] for v, b in pairs}
            # Fewer 10 ms jobs: each takes as long as 10 no-op ones. More
            # rounds of no-op jobs: they are quick, and they vary the most.
            count = n if job_ms < 10 else n // 4
            for _ in range(reps if job_ms else 2 * reps + 1):
                # Interleaved, so that the machine's load falls on all alike.
                rate = {
                    v: throughput(url, v, processes, count, job_ms, pin=args.pin)
                    for v in variants
                }
                for v in variants:
                    rates[v].append(rate[v])
                for v, b in pairs:
                    ratios[f"{v} / {b}"].append(rate[v] / rate[b])
            cells: dict[str, float] = {
                f"{v} jobs/s": statistics.median(rates[v]) for v in variants
            }
            for label, values in ratios.items():
                cells[label] = statistics.median(values)
                cells[f"{label}, lowest"] = min(values)
                cells[f"{label}, highest"] = max(values)
            what = "no-op jobs" if not job_ms else f"{job_ms} ms jobs"
            row[f"{what}, {processes} processes"] = cells
        if not args.pin:
            latencies = rescue_and_cancel(url, reps)
            row["latency s (median)"] = {
                k: statistics.median(v) for k, v in latencies.items()
            }
        results["stores"][name] = row
    if output is None and not args.quick:
        output = HERE / "results" / ("jobs_pinned.json" if args.pin else "jobs.json")
    if output is not None:
        output.write_text(json.dumps(results, indent=2) + "\n")
    for name, row in results["stores"].items():
        print(f"## {name}")
        for key, values in row.items():
            print(f"{key}:")
            for label, value in values.items():
                print(f"    {label:<72} {value:10.3f}")


if __name__ == "__main__":
    main()
