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

Try: kill the worker with SIGKILL mid-job and start it again (after its
``--lease`` has run out, the job resumes from its saved step); submit a
``stubborn`` job and cancel it (it ends only when ``--cancel-grace`` runs
out); give a job ``--timeout`` or ``--fail-at`` (``status --traceback``
shows where it failed); run several workers on one store. Under an
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

KINDS = ("steps", "stubborn", "blocking")


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


def make_worker(store: JobStore, args: argparse.Namespace) -> jobs.Worker:
    """The worker the options ask for; a bad option raises ValueError or TypeError."""
    ids = {} if args.worker_id is None else {"worker_id": args.worker_id}
    return jobs.Worker(
        store,
        job_functions(args.audit),
        **ids,
        concurrency=args.concurrency,
        grace=args.grace,
        cancel_grace=args.cancel_grace,
        lease=args.lease,
        stale_after=args.stale_after,
        poll_interval=0.1,
    )


async def run_worker(
    worker: jobs.Worker,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve jobs until the program shuts down."""
    runner = trio_graceful.current_runner()
    await runner.start_service(worker.serve, name="jobs worker")
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


async def status(store: JobStore, args: argparse.Namespace) -> None:
    now = store.now()
    for job in await store.jobs(args.ids or None):
        if args.json:
            print(json.dumps(job.as_json(now=now)))
            continue
        step = (job.progress or {}).get("step", 0)
        line = f"{job.id} {job.kind} {job.state.value} step={step}"
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
    parser.add_argument("--store", default="sqlite:///jobs.db")
    parser.add_argument(
        "--debug", action="store_true", help="log at DEBUG, with errors' tracebacks"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser("worker", help="run jobs until SIGTERM or SIGINT")
    worker.add_argument("--concurrency", type=count, default=4)
    worker.add_argument("--cancel-grace", type=seconds, default=5.0)
    worker.add_argument("--lease", type=positive, default=30.0)
    worker.add_argument("--stale-after", type=seconds, default=60.0)
    worker.add_argument("--worker-id", default=None)
    worker.add_argument("--audit", default=None)
    trio_graceful.add_run_arguments(worker)  # --grace, --drain-delay, ...
    sub = commands.add_parser("submit", help="queue a job; print its id")
    sub.add_argument("kind", type=kind)
    sub.add_argument("--steps", type=count, default=10)
    sub.add_argument("--step-ms", type=seconds, default=100.0)
    sub.add_argument("--timeout", type=positive, default=None)
    sub.add_argument("--fail-at", type=count, default=None)
    sub.add_argument("--hang-at", type=count, default=None)
    sub.add_argument("--max-attempts", type=count, default=3)
    cancel = commands.add_parser("cancel", help="request a job's cancellation; say so")
    cancel.add_argument("id")
    stat = commands.add_parser("status", help="show jobs")
    stat.add_argument("ids", nargs="*")
    stat.add_argument("--json", action="store_true")
    stat.add_argument(
        "--traceback", action="store_true", help="show failed jobs' tracebacks"
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
                # The program's grace covers the jobs' grace and the hand-backs.
                options["grace"] = args.grace + 5
                return trio_graceful.run(
                    run_worker, worker, **options, name="jobs worker"
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
