"""procrastinate and pgqueuer: the job queues measured beside trio_graceful.jobs.

Each runs its documented worker in a process of its own, on asyncio as it is
meant to, with its default durability:

* procrastinate: ``App.run_worker_async(concurrency=N)`` over its
  ``PsycopgConnector`` (a psycopg pool), the worker ``App.run_worker`` runs;
* pgqueuer: ``pgqueuer.run(factory, batch_size=B)``, what ``pgq run`` runs,
  over one asyncpg connection, the job's entrypoint registered with
  ``concurrency_limit=N`` (0 is pgqueuer's default: no limit).

A job records when it started and ended (`time.monotonic`, one clock for
every process of the machine); the process prints the first start, the last
end and the count when its worker has stopped (SIGTERM, which both workers
handle as a graceful stop).

Neither library is a dependency of the project: ``pip install -r
bench/requirements-peers.txt``. Without them their variants are skipped,
with the reason printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

try:
    import procrastinate
except ImportError:
    procrastinate = None
try:
    import asyncpg
    import pgqueuer
except ImportError:
    pgqueuer = None

REQUIREMENTS = "bench/requirements-peers.txt"


def missing(library: str) -> str | None:
    """Why ``library`` cannot be measured here, or None if it can."""
    module = {"procrastinate": procrastinate, "pgqueuer": pgqueuer}[library]
    if module is not None:
        return None
    return f"{library} is not installed (pip install -r {REQUIREMENTS})"


def version(library: str) -> str | None:
    module = {"procrastinate": procrastinate, "pgqueuer": pgqueuer}[library]
    return None if module is None else str(module.__version__)


class Span:
    """The first start and the last end of the jobs one process ran."""

    def __init__(self) -> None:
        self.first = float("inf")
        self.last = float("-inf")
        self.count = 0

    def add(self, started: float, ended: float) -> None:
        self.first = min(self.first, started)
        self.last = max(self.last, ended)
        self.count += 1

    def report(self) -> None:
        """The line the measuring process reads (`read_span`)."""
        print(f"span {self.first!r} {self.last!r} {self.count}", flush=True)


def read_span(output: str) -> tuple[float, float, int]:
    """The first start, the last end and the count from a worker's output."""
    [line] = [line for line in output.splitlines() if line.startswith("span ")]
    _, first, last, count = line.split()
    return float(first), float(last), int(count)


async def _go() -> None:
    """Say that the worker is ready, and wait for the measuring process's "go"."""
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


# -- procrastinate ------------------------------------------------------------


def procrastinate_app(url: str, job_ms: float, span: Span) -> Any:
    """An App with one task, ``noop``, that waits ``job_ms``."""
    assert procrastinate is not None
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop")
    async def noop() -> None:
        started = time.monotonic()
        if job_ms:
            await asyncio.sleep(job_ms / 1000)
        span.add(started, time.monotonic())

    return app


def procrastinate_worker(url: str, concurrency: int, job_ms: float) -> None:
    span = Span()
    app = procrastinate_app(url, job_ms, span)

    async def main() -> None:
        async with app.open_async():
            # The pool is open (its connections made) before "go".
            await app.check_connection_async()
            await _go()
            await app.run_worker_async(concurrency=concurrency)

    asyncio.run(main())
    span.report()


async def procrastinate_install(url: str) -> None:
    app = procrastinate_app(url, 0, Span())
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def procrastinate_submit(url: str, n: int) -> None:
    app = procrastinate_app(url, 0, Span())
    async with app.open_async():
        await app.tasks["noop"].batch_defer_async(*[{}] * n)


# -- pgqueuer -----------------------------------------------------------------


def pgqueuer_worker(url: str, limit: int, batch_size: int, job_ms: float) -> None:
    assert pgqueuer is not None
    span = Span()

    async def main() -> None:
        connection = await asyncpg.connect(url)
        pgq = pgqueuer.PgQueuer.from_asyncpg_connection(connection)

        @pgq.entrypoint("noop", concurrency_limit=limit)
        async def noop(job: object) -> None:
            started = time.monotonic()
            if job_ms:
                await asyncio.sleep(job_ms / 1000)
            span.add(started, time.monotonic())

        @contextlib.asynccontextmanager
        async def factory() -> AsyncIterator[object]:
            yield pgq

        await _go()
        await pgqueuer.run(factory, batch_size=batch_size)
        await connection.close()

    asyncio.run(main())
    span.report()


async def pgqueuer_install(url: str) -> None:
    assert pgqueuer is not None
    connection = await asyncpg.connect(url)
    try:
        await pgqueuer.Queries(pgqueuer.AsyncpgDriver(connection)).install()
    finally:
        await connection.close()


async def pgqueuer_submit(url: str, n: int) -> None:
    assert pgqueuer is not None
    connection = await asyncpg.connect(url)
    try:
        queries = pgqueuer.Queries(pgqueuer.AsyncpgDriver(connection))
        await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
    finally:
        await connection.close()


INSTALL: dict[str, Callable[[str], Any]] = {
    "procrastinate": procrastinate_install,
    "pgqueuer": pgqueuer_install,
}
SUBMIT: dict[str, Callable[[str, int], Any]] = {
    "procrastinate": procrastinate_submit,
    "pgqueuer": pgqueuer_submit,
}
# How many of the queued jobs have ended, in each library's tables.
ENDED = {
    "procrastinate": (
        "SELECT count(*) FROM procrastinate_jobs"
        " WHERE status IN ('succeeded', 'failed')"
    ),
    # pgqueuer moves an ended job from its queue table to its log.
    "pgqueuer": "SELECT %(n)s - count(*) FROM pgqueuer",
}
