"""What a running job sees: its STOP, its progress, per-call timeouts, threads.

A job function gets a `JobContext`. Cancellation and a worker's shutdown
reach it in band first: `JobContext.stop_received` becomes true and
`JobContext.checkpoint` raises `JobStopped`, at points the job chooses.
Only if the job has not ended when the grace runs out is it hard-cancelled.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import Any, TypeVar, final

import attrs
import trio

from .._children._threads import StopFlag, ThreadBudget, run_in_thread
from .._core._bundle import Bundle
from .._core._lowlevel import NoPublicConstructor
from ._checks import check_timeout
from ._exceptions import CallTimeoutError, JobStopped
from ._jsonrule import check_object
from ._records import JobRecord

R = TypeVar("R")


@final
@attrs.define(eq=False)
class JobContext(metaclass=NoPublicConstructor):
    """The handle a job function gets from its `Worker`.

    Its methods must be called from the job's own tasks.
    """

    _job: JobRecord
    _bundle: Bundle
    _save: Callable[[Mapping[str, Any]], Awaitable[None]]
    _now: Callable[[], float]
    _heartbeat_interval: float
    _budget: ThreadBudget | None
    _stop: trio.Event = attrs.field(factory=trio.Event, init=False)
    _progress: Mapping[str, Any] | None = attrs.field(default=None, init=False)
    _saved_at: float = attrs.field(default=-math.inf, init=False)
    _failed: list[str] = attrs.field(factory=list[str], init=False)

    def __attrs_post_init__(self) -> None:
        self._progress = self._job.progress

    @property
    def job(self) -> JobRecord:
        """The job's record as it was when this attempt was claimed."""
        return self._job

    @property
    def attempt(self) -> int:
        """This attempt's number, from 1."""
        return self._job.attempts

    @property
    def progress(self) -> Mapping[str, Any] | None:
        """The latest progress; at the start, what the last attempt saved."""
        return self._progress

    @property
    def failed_subtasks(self) -> tuple[str, ...]:
        """The calls reported with `subtask_failed`, in order."""
        return tuple(self._failed)

    @property
    def stop_received(self) -> bool:
        """True once the job has got STOP (from a cancel or the worker's shutdown)."""
        return self._stop.is_set()

    def _request_stop(self) -> None:
        self._stop.set()

    async def checkpoint(self) -> None:
        """A point where the job may stop: raise `JobStopped` if asked to.

        This is a checkpoint.

        Raises:
            JobStopped: if `stop_received`.
        """
        await trio.lowlevel.checkpoint()
        if self._stop.is_set():
            raise JobStopped(f"job {self._job.id} was asked to stop")

    async def wait_stop(self) -> None:
        """Wait until the job is asked to stop. This is a checkpoint."""
        await self._stop.wait()

    async def report_progress(
        self, progress: Mapping[str, Any], *, save_now: bool = False
    ) -> None:
        """Record the job's progress (a JSON object), and save it now and then.

        The progress is persisted with the heartbeat time at most once per
        the worker's ``heartbeat_interval`` (so a chatty job does not hammer
        the store), or at once with ``save_now=True``. The latest progress is
        always saved when the job is handed back. A resumed attempt starts
        from the last progress saved. During a store outage the call does
        not wait: the latest progress is written when the store is back.
        This is a checkpoint.

        Raises:
            TypeError: if ``progress`` is not a mapping, or holds a value
                JSON has not (the message gives its path).
            ValueError: for NaN or an infinity in ``progress``.
        """
        self._progress = check_object(progress, what="progress")
        now = self._now()
        if save_now or now - self._saved_at >= self._heartbeat_interval:
            self._saved_at = now
            await self._save(self._progress)
        else:
            await trio.lowlevel.checkpoint()

    def subtask_failed(self, name: str) -> None:
        """Record that the sub-task ``name`` failed and the job went on without it.

        The job's final record lists these in `JobRecord.failed_subtasks`.
        Not a checkpoint.
        """
        self._failed.append(name)

    @contextlib.contextmanager
    def call_timeout(self, seconds: float, *, name: str) -> Generator[None, None, None]:
        """Give the calls in the block ``seconds`` to finish.

        The limit nests under the job's own timeout (the earlier deadline
        wins). When it passes, the block is cancelled and
        `CallTimeoutError` raised: catch it to go on without that call.

        Raises:
            CallTimeoutError: if the block ran out of time.
            TypeError, ValueError: for a bad ``seconds``.
        """
        limit = check_timeout(seconds, argument="seconds")
        assert limit is not None
        started = trio.current_time()
        with trio.move_on_after(limit) as scope:
            yield
        if scope.cancelled_caught:
            raise CallTimeoutError(name, trio.current_time() - started, limit)

    async def run_in_thread(
        self, sync_fn: Callable[[StopFlag], R], *, name: str | None = None
    ) -> R:
        """Run ``sync_fn(stop_flag)`` in a thread, under the worker's budget.

        The budget is the `~trio_graceful.ThreadBudget` given to the `Worker`.

        The flag is set when the job is asked to stop; a hard cancel abandons
        the thread (see `trio_graceful.run_in_thread`). This is a checkpoint.
        """
        return await run_in_thread(
            sync_fn, bundle=self._bundle, name=name, budget=self._budget
        )
