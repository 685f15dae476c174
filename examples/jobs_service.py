"""Durable background jobs: a worker service and its command-line clients.

Shows `trio_graceful.jobs` in a real service: a worker that runs under
`trio_graceful.run` (SIGTERM or Ctrl+C drains it: running jobs get STOP and
``--grace`` seconds, what is left goes back to the queue with its progress),
and clients that submit, cancel and inspect jobs through the same store.

Run it::

    python examples/jobs_service.py worker --audit audit.jsonl &
    python examples/jobs_service.py submit steps --steps 20 --step-ms 200
    python examples/jobs_service.py cancel ID
    python examples/jobs_service.py status --json
    python examples/jobs_service.py status --traceback

The worker says at its start which id, store, lease and grace it runs
with; ``status`` shows which worker holds each running job and when its
lease ends.

Try: kill the worker with SIGKILL mid-job and start it again: under the
same ``--worker-id`` it takes its jobs over at once, under another (each
start picks a new one by default) they wait until the dead worker's
``--lease`` has run out; either way the job resumes from its saved step.
Submit a
``stubborn`` job and cancel it (it ends only when ``--cancel-grace`` runs
out); give a job ``--timeout`` or ``--fail-at`` (``status --traceback``
shows where it failed); run several workers on one store. ``--help``
after any command lists its options and their defaults. Under an
orchestrator, ``--health-port`` serves ``/readyz`` and ``--drain-delay S``
keeps the worker taking jobs for S seconds after SIGTERM, not ready.

Exit status: 0 on success; 1 for an error, said in one line on stderr
(``jobs_service: error: ...``: a store that cannot be opened, such as a
missing or read-only directory or an unreachable PostgreSQL server, an
unknown job id, a bad worker option; ``--debug`` adds its traceback); 1
too if a running worker stops with an error (its traceback is logged);
2 for a command line that argparse refuses.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import os
import sys
import textwrap
import time
import urllib.parse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio

import trio_graceful
from trio_graceful import jobs
from trio_graceful.jobs import JobNotFoundError, StoreError, open_store

if TYPE_CHECKING:
    from trio_graceful.jobs import JobContext, JobFunction, JobStore

# The clients (submit, cancel, status) load only the store; the worker's
# names (jobs.Worker, jobs.JobStopped) load when the worker runs.

# --grace is the program's whole shutdown: the jobs get all of it but the
# time kept to hand back what is left (HANDBACK s, or half of a short grace).
DEFAULT_GRACE = 15.0
HANDBACK = 5.0

# The states in which a worker holds a job, and its lease says it is alive.
HELD = ("running", "cancelling", "timing_out")


def append_audit(path: str | None, line: dict[str, Any]) -> None:
    """Append one JSON line; O_APPEND keeps lines of several processes whole."""
    if path is None:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def job_functions(audit: str | None) -> dict[str, JobFunction]:
    """The three kinds of job, writing to ``audit`` after each step's work."""

    def record(ctx: JobContext, step: int) -> None:
        append_audit(
            audit,
            {
                "job": ctx.job.id,
                "attempt": ctx.attempt,
                "worker": ctx.job.worker,
                "step": step,
                "t": time.time(),
            },
        )

    def plan(ctx: JobContext) -> tuple[range, float, int | None, int | None]:
        p = ctx.job.payload
        start = int((ctx.progress or {}).get("step", 0)) + 1
        return (
            range(start, int(p["steps"]) + 1),
            float(p["step_ms"]) / 1000,
            p.get("fail_at"),
            p.get("hang_at"),
        )

    async def steps(ctx: JobContext, *, cooperative: bool = True) -> dict[str, int]:
        todo, seconds, fail_at, hang_at = plan(ctx)
        for k in todo:
            if cooperative:
                await ctx.checkpoint()
            if k == hang_at:
                if cooperative:
                    await ctx.wait_stop()
                    raise jobs.JobStopped
                await trio.sleep_forever()
            if k == fail_at:
                raise RuntimeError(f"failed at step {k}")
            await trio.sleep(seconds)
            record(ctx, k)
            await ctx.report_progress({"step": k}, save_now=True)
        return {"steps": todo.stop - 1}

    async def stubborn(ctx: JobContext) -> dict[str, int]:
        return await steps(ctx, cooperative=False)

    async def blocking(ctx: JobContext) -> dict[str, int]:
        todo, seconds, fail_at, hang_at = plan(ctx)

        def work(flag: trio_graceful.StopFlag) -> None:
            for k in todo:
                if flag.is_set():
                    raise jobs.JobStopped
                if k == hang_at:
                    flag.wait()
                    raise jobs.JobStopped
                if k == fail_at:
                    raise RuntimeError(f"failed at step {k}")
                time.sleep(seconds)
                record(ctx, k)
                save = functools.partial(ctx.report_progress, save_now=True)
                trio.from_thread.run(save, {"step": k})

        await ctx.run_in_thread(work, name=f"steps of {ctx.job.id}")
        return {"steps": todo.stop - 1}

    return {"steps": steps, "stubborn": stubborn, "blocking": blocking}


# The kinds the worker knows, read off its registry of job functions.
KINDS = tuple(job_functions(None))


def jobs_grace(grace: float) -> float:
    """The part of the program's ``grace`` that the running jobs get."""
    return grace - min(HANDBACK, grace / 2)


def make_worker(store: JobStore, args: argparse.Namespace) -> jobs.Worker:
    """The worker the options ask for; a bad option raises ValueError or TypeError."""
    ids = {} if args.worker_id is None else {"worker_id": args.worker_id}
    return jobs.Worker(
        store,
        job_functions(args.audit),
        **ids,
        concurrency=args.concurrency,
        grace=jobs_grace(args.grace),
        cancel_grace=args.cancel_grace,
        lease=args.lease,
        stale_after=args.stale_after,
        poll_interval=0.1,
    )


def public_url(url: str) -> str:
    """``url`` without its password, to be logged."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def start_line(worker: jobs.Worker, args: argparse.Namespace) -> str:
    """What the worker says once it serves: who it is, where, for how long."""
    return (
        f"worker {worker.worker_id} serving {public_url(args.store)}: "
        f"kinds {', '.join(KINDS)}; concurrency {worker.concurrency}; "
        f"lease {worker.lease:g} s (after a crash, a restart with --worker-id "
        f"{worker.worker_id} takes its jobs over at once; under another id "
        f"they wait for the lease to run out); grace {args.grace:g} s "
        f"({worker.grace:g} s for the jobs to finish, the rest to hand them "
        f"back); cancel grace {worker.cancel_grace:g} s"
    )


async def run_worker(
    worker: jobs.Worker,
    args: argparse.Namespace,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve jobs until the program shuts down."""
    runner = trio_graceful.current_runner()
    await runner.start_service(worker.serve, name="jobs worker")
    logging.getLogger("jobs_service").info("%s", start_line(worker, args))
    task_status.started()
    _, inbox = runner.root.open_inbox()
    await inbox.receive()


async def submit(store: JobStore, args: argparse.Namespace) -> None:
    payload = {"steps": args.steps, "step_ms": args.step_ms}
    if args.fail_at is not None:
        payload["fail_at"] = args.fail_at
    if args.hang_at is not None:
        payload["hang_at"] = args.hang_at
    job_id = await store.submit(
        args.kind, payload, timeout=args.timeout, max_attempts=args.max_attempts
    )
    print(job_id)


def lease_text(ends_in: float) -> str:
    if ends_in >= 0:
        return f"lease ends in {ends_in:.0f} s"
    return f"lease ended {-ends_in:.0f} s ago (a worker's rescue will settle it)"


async def status(store: JobStore, args: argparse.Namespace) -> None:
    now = store.now()
    found = await store.jobs(args.ids or None)
    held = any(job.state.value in HELD for job in found)
    leases = await store.leases() if held else {}
    for job in found:
        # The lease of the worker holding the job: None if it dropped it.
        expires = leases.get(job.worker or "") if job.state.value in HELD else None
        ends_in = None if expires is None else expires - now
        if args.json:
            row = job.as_json(now=now)
            row["lease_expires_at"] = expires
            row["lease_ends_in"] = ends_in
            print(json.dumps(row))
            continue
        step = (job.progress or {}).get("step", "none")
        line = f"{job.id} {job.kind} {job.state.value} step={step}"
        if job.state.value in HELD:
            line += f" worker={job.worker}"
            line += " no lease" if ends_in is None else f" {lease_text(ends_in)}"
        waited = job.waited(now)
        if waited is not None:
            # A kind that no running worker knows waits here.
            line += f" waited={waited:.1f}s"
        if job.error is not None:
            line += f" error={job.error}"
        print(line)
        if args.traceback and job.traceback is not None:
            print(textwrap.indent(job.traceback, "    "), end="")


def seconds(text: str, *, positive: bool = False) -> float:
    """A finite number of seconds, >= 0 (> 0 if ``positive``), for argparse."""
    value = float(text)
    if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
        bound = "> 0" if positive else ">= 0"
        raise argparse.ArgumentTypeError(
            f"must be a finite number {bound}, not {text!r}"
        )
    return value


def count(text: str) -> int:
    """A whole number >= 1, for argparse."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {text!r}")
    return value


def kind(text: str) -> str:
    """A kind the worker knows, for argparse."""
    if text not in KINDS:
        raise argparse.ArgumentTypeError(
            f"unknown job kind {text!r}; the kinds are {', '.join(KINDS)}"
        )
    return text


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    positive = functools.partial(seconds, positive=True)
    positive.__name__ = "seconds"  # type: ignore[attr-defined]
    parser = argparse.ArgumentParser(
        description="Durable background jobs: a worker and its clients."
    )
    parser.add_argument(
        "--store",
        default="sqlite:///jobs.db",
        help="the job store: sqlite:///PATH (four slashes for an absolute "
        "path) or postgresql://USER@HOST/DATABASE (default: %(default)s)",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="log at DEBUG, with errors' tracebacks (default: off)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser(
        "worker",
        help="run jobs until SIGTERM or SIGINT",
        description="Run jobs until SIGTERM or SIGINT. At that signal the "
        "running jobs get STOP and --grace, less the time kept to hand back "
        f"to the queue what is left ({HANDBACK:g} s, or half of a shorter "
        "grace).",
    )
    option = worker.add_argument
    option(
        "--concurrency",
        type=count,
        default=4,
        help="jobs run at once (default: %(default)s)",
    )
    option(
        "--cancel-grace",
        type=seconds,
        default=5.0,
        help="seconds a job asked to cancel gets to stop before it is "
        "hard-cancelled (default: %(default)g)",
    )
    option(
        "--lease",
        type=positive,
        default=30.0,
        help="seconds the worker's lease lasts, renewed every third of it; "
        "after a crash, other workers wait this long before they rescue its "
        "jobs (default: %(default)g)",
    )
    option(
        "--stale-after",
        type=seconds,
        default=60.0,
        help="seconds without saved progress after which status reports a "
        "running job stale (default: %(default)g)",
    )
    option(
        "--worker-id",
        default=None,
        help="this worker's id; a restart under the same id takes over the "
        "jobs the last process left at once (default: HOST-PID-RANDOM, new "
        "at each start)",
    )
    option(
        "--audit",
        default=None,
        metavar="FILE",
        help="append a JSON line to FILE after each step of a job (default: none)",
    )
    # --grace, --drain-delay, ...; the jobs get all of --grace but the time
    # to hand back what is left (see jobs_grace).
    trio_graceful.add_run_arguments(worker, grace=DEFAULT_GRACE)
    sub = commands.add_parser(
        "submit",
        help="queue a job; print its id",
        description=f"Queue a job; print its id. The kinds: {', '.join(KINDS)}.",
    )
    sub.add_argument("kind", type=kind, help=f"one of {', '.join(KINDS)}")
    add = sub.add_argument
    add("--steps", type=count, default=10, help="steps (default: %(default)s)")
    add(
        "--step-ms",
        type=seconds,
        default=100.0,
        help="milliseconds each step takes (default: %(default)g)",
    )
    add(
        "--timeout",
        type=positive,
        default=None,
        help="seconds one attempt may run (default: no limit)",
    )
    add(
        "--fail-at",
        type=count,
        default=None,
        metavar="STEP",
        help="raise an error at this step (default: never)",
    )
    add(
        "--hang-at",
        type=count,
        default=None,
        metavar="STEP",
        help="wait at this step until asked to stop (default: never)",
    )
    add(
        "--max-attempts",
        type=count,
        default=3,
        help="attempts that may end with a dead worker before the job "
        "fails (default: %(default)s)",
    )
    cancel = commands.add_parser("cancel", help="request a job's cancellation; say so")
    cancel.add_argument("id", help="the job's id, as submit printed it")
    stat = commands.add_parser("status", help="show jobs")
    stat.add_argument("ids", nargs="*", help="the jobs to show (default: all)")
    stat.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per job, per line (default: text)",
    )
    stat.add_argument(
        "--traceback",
        action="store_true",
        help="show failed jobs' tracebacks (default: off)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    # The store is opened, and the worker made, before anything runs: an
    # error there is one line, not the traceback of a failed startup.
    try:
        store = open_store(args.store)
    except (ValueError, StoreError) as exc:
        return failed(exc)
    with store:
        try:
            if args.command == "worker":
                worker = make_worker(store, args)
                options = trio_graceful.run_arguments(args)
                return trio_graceful.run(
                    run_worker, worker, args, **options, name="jobs worker"
                )
            if args.command == "submit":
                trio.run(submit, store, args)
            elif args.command == "cancel":
                job = trio.run(store.request_cancel, args.id)
                # A queued job is cancelled at once; a running one is told
                # by its worker and has the cancel grace to stop.
                print(f"cancellation of {job.id} requested; it is {job.state.value}")
            else:
                trio.run(status, store, args)
        except (JobNotFoundError, TypeError, ValueError, StoreError) as exc:
            return failed(exc)
    return 0


def failed(exc: Exception) -> int:
    """Say what went wrong in one line (its traceback at DEBUG); return 1."""
    print(f"jobs_service: error: {exc}", file=sys.stderr)
    logging.getLogger("jobs_service").debug("the error's traceback", exc_info=exc)
    return 1


if __name__ == "__main__":
    sys.exit(main())
