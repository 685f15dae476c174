"""A worker's way to its store: outages retried, logged once, and reported.

Every store operation of a worker goes through `StoreAccess.call`. An error
the store calls an outage (`JobStore.is_outage`) is retried with capped
exponential backoff and jitter (so that a fleet of workers does not hammer
a database that comes back); any other error is raised. The first failure
begins an outage, logged once at WARNING with what failed; the first
success ends it, logged once at INFO with its duration. Meanwhile the
program's lifecycle (under `trio_graceful.run`) is ``degraded`` with the
reason, so ``/readyz`` and ``/statusz`` say why.

Retries go on until the store is back, or, once the worker drains, until
its grace runs out (`give_up_at`): then `StoreUnavailableError` is raised
and what was not written is left for the lease rescue.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import attrs
import trio

from .._core._log import library_logger
from .._run._program._lifecycle import Lifecycle, LifecycleState
from ._exceptions import StoreUnavailableError
from ._store import JobStore

logger = library_logger("trio_graceful.jobs")

R = TypeVar("R")


@attrs.define(eq=False)
class StoreAccess:
    """The store as one worker sees it, with its outages.

    Args:
        store (JobStore): The store.
        name (str): Who is speaking in the log (``worker ID``).
        lifecycle (Lifecycle or None): Degraded during outages, if given.
        first_delay (float): Seconds before the first retry.
        max_delay (float): The cap of the doubling delay between retries.
    """

    store: JobStore
    name: str
    lifecycle: Lifecycle | None = None
    first_delay: float = 0.05
    max_delay: float = 2.0
    _down_since: float | None = attrs.field(default=None, init=False)
    _reason: str = attrs.field(default="", init=False)
    _back: trio.Event = attrs.field(factory=trio.Event, init=False)
    _give_up_at: float = attrs.field(default=math.inf, init=False)
    _giving_up: trio.Event = attrs.field(factory=trio.Event, init=False)
    _random: random.Random = attrs.field(factory=random.Random, init=False)

    @property
    def down(self) -> bool:
        """True during an outage. Not a checkpoint."""
        return self._down_since is not None

    def give_up_at(self, deadline: float) -> None:
        """Stop retrying at ``deadline`` (Trio time). Not a checkpoint."""
        self._give_up_at = min(self._give_up_at, deadline)
        self._giving_up.set()

    async def call(
        self, what: str, operation: Callable[[], Awaitable[R]], *, writes: bool = True
    ) -> R:
        """Run ``operation`` until it succeeds or fails with a bug.

        ``what`` says what the worker was doing, for the log. Only an
        operation that ``writes`` ends an outage when it succeeds: a locked
        SQLite file still serves reads. This is a checkpoint.

        Raises:
            StoreUnavailableError: if the store is still away at the
                deadline set by `give_up_at`.
        """
        delay = self.first_delay
        while True:
            try:
                result = await operation()
            except Exception as exc:
                if not self.store.is_outage(exc):
                    raise
                self._begin(what, exc)
                retry_at = trio.current_time() + delay * self._random.uniform(0.5, 1)
                if retry_at >= self._give_up_at:
                    raise StoreUnavailableError(
                        f"the store is still away at the worker's shutdown: {exc}"
                    ) from exc
                with trio.move_on_at(retry_at):
                    await self._giving_up.wait()
                    await trio.sleep_until(min(retry_at, self._give_up_at))
                delay = min(delay * 2, self.max_delay)
            else:
                if writes:
                    self._end()
                return result

    async def wait_recovered(self) -> None:
        """Wait until the next outage ends. This is a checkpoint."""
        await self._back.wait()

    def note(self, what: str, exc: Exception) -> bool:
        """Begin an outage if ``exc`` is one, for a caller that will not retry.

        Returns whether it is one. Not a checkpoint.
        """
        if not self.store.is_outage(exc):
            return False
        self._begin(what, exc)
        return True

    def _begin(self, what: str, exc: Exception) -> None:
        if self._down_since is not None:
            return
        self._down_since = trio.current_time()
        self._reason = f"{self.name}: job store unreachable ({what}: {exc})"
        logger.warning("%s; retrying, claiming paused", self._reason)
        lifecycle = self.lifecycle
        if lifecycle is not None and lifecycle.ready:
            lifecycle.degrade(self._reason)

    def _end(self) -> None:
        if self._down_since is None:
            return
        lasted = trio.current_time() - self._down_since
        self._down_since = None
        logger.info("%s: job store back after %.1f s", self.name, lasted)
        self._back.set()
        self._back = trio.Event()
        lifecycle = self.lifecycle
        # Recover only from our own degradation: another part may have
        # degraded the program since.
        if (
            lifecycle is not None
            and lifecycle.state is LifecycleState.DEGRADED
            and lifecycle.reason == self._reason
        ):
            lifecycle.recover(f"{self.name}: job store back after {lasted:.1f} s")
