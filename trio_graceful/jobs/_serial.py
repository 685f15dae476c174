"""A store's synchronous calls, one at a time, each in a worker thread.

A store's connection serves one call at a time, so its calls queue for a
lock and run in a thread from Trio's thread cache. They take no
`trio.CapacityLimiter` (at most one thread per store runs anyway) and no
copy of the context, and an uncontended lock is taken without a trip
through the scheduler: a worker makes one or two calls per job, and the
trips would cost more than the queries of a job that does nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import attrs
import outcome
import trio

from .._core._lowlevel import forbid_abort

R = TypeVar("R")


async def run_in_thread(call: Callable[[], R]) -> R:
    """Run ``call`` in a thread of Trio's cache; wait for it, uncancellably.

    A cancel point before the call starts only. This is a checkpoint.
    """
    await trio.lowlevel.checkpoint_if_cancelled()
    task = trio.lowlevel.current_task()
    token = trio.lowlevel.current_trio_token()

    def deliver(result: outcome.Outcome[R]) -> None:
        token.run_sync_soon(trio.lowlevel.reschedule, task, result)

    trio.lowlevel.start_thread_soon(call, deliver, name="trio_graceful job store")
    # The call runs to its end, as `trio.to_thread.run_sync` lets it: its
    # transaction is committed or rolled back, never left half-known.
    result: R = await trio.lowlevel.wait_task_rescheduled(forbid_abort)
    return result


@attrs.define(eq=False)
class SerialCalls:
    """Runs a store's calls one at a time, each in a thread unless asked not to."""

    _lock: trio.StrictFIFOLock = attrs.field(factory=trio.StrictFIFOLock, init=False)

    async def run(self, call: Callable[[], R], *, offload: bool = True) -> R:
        """Run ``call`` when the calls before it have ended. This is a checkpoint.

        With ``offload=False`` the call runs in the Trio thread, still after a
        checkpoint, so that a store behaves alike under Trio's mock clock.
        """
        await self.acquire()
        try:
            return await self.run_held(call, offload=offload)
        finally:
            self.release()

    async def acquire(self) -> None:
        """Wait for the store's turn; cancellable. This is a checkpoint.

        An uncontended turn is taken without a trip through the scheduler
        (`run_held` checkpoints anyway).
        """
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            await self._lock.acquire()

    def release(self) -> None:
        """Give the turn to the next call. Not a checkpoint."""
        self._lock.release()

    @staticmethod
    async def run_held(call: Callable[[], R], *, offload: bool) -> R:
        """Run ``call`` in the turn taken by `acquire`. This is a checkpoint."""
        if offload:
            return await run_in_thread(call)
        await trio.lowlevel.checkpoint()
        return call()
