"""A worker process whose jobs all return at once, at SIGUSR1.

``python -m tests.support.job_groups URL WORKER_ID CONCURRENCY AUDIT`` runs
a worker of kind ``k`` until SIGTERM. Each job writes a line to AUDIT as it
starts, waits for the process's SIGUSR1, writes a line as it returns, and
returns: the jobs of the worker end together, and their endings make a
group.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import trio

from trio_graceful import open_inbox
from trio_graceful.jobs import JobContext, Worker, open_store


def note(audit: str, ctx: JobContext, event: str) -> None:
    line = {"job": ctx.job.id, "attempt": ctx.attempt, "event": event}
    fd = os.open(audit, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


async def serve(url: str, worker_id: str, concurrency: int, audit: str) -> None:
    released = trio.Event()

    async def job(ctx: JobContext) -> str:
        note(audit, ctx, "started")
        await released.wait()
        note(audit, ctx, "returned")
        return "done"

    with open_store(url) as store:
        worker = Worker(
            store,
            {"k": job},
            worker_id=worker_id,
            concurrency=concurrency,
            poll_interval=0.05,
        )
        sender, receiver = open_inbox()
        with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.serve, receiver)
                async for signum in signals:
                    if signum == signal.SIGUSR1:
                        released.set()
                    else:
                        sender.stop()
                        break


if __name__ == "__main__":
    url, worker_id, concurrency, audit = sys.argv[1:]
    trio.run(serve, url, worker_id, int(concurrency), audit)
