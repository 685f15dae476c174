"""Helpers shared by the job tests: stores under the mock clock."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import Any

import trio

from trio_graceful import InboxReceiver, InboxSender, open_inbox
from trio_graceful.jobs import JobContext, JobStore, Worker, open_store

# Stores made by mock_store, closed after each test (tests/jobs/conftest.py).
opened: list[JobStore] = []


def mock_store(path: str = ":memory:") -> JobStore:
    """A store whose clock is Trio's and whose queries run in the Trio thread.

    It is closed when the test ends.
    """
    store = open_store(f"sqlite:///{path}", clock=trio.current_time, offload=False)
    opened.append(store)
    return store


@asynccontextmanager
async def serving(worker: Worker) -> AsyncGenerator[InboxSender[Any], None]:
    """Run ``worker`` while the block runs; ``sender.stop()`` begins its shutdown."""
    sender: InboxSender[Any]
    receiver: InboxReceiver[Any]
    sender, receiver = open_inbox()
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.serve, receiver)
        yield sender
        sender.stop()


async def steps(ctx: JobContext) -> int:
    """Cooperative: one-second steps, progress saved after each; resumes."""
    steps = int(ctx.job.payload.get("steps", 100))
    start = int((ctx.progress or {}).get("step", 0))
    for k in range(start, steps):
        await ctx.checkpoint()
        await trio.sleep(1)
        await ctx.report_progress({"step": k + 1}, save_now=True)
    return steps


async def stubborn(ctx: JobContext) -> None:
    """Never looks at STOP: only a hard cancel ends it."""
    await trio.sleep(100)
