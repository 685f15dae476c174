"""Threads as children of a bundle: a stop flag for STOP, a report for the rest.

A thread cannot be cancelled, so `run_in_thread` gives it the two things that
can be done instead:

* **Graceful:** the function gets a `StopFlag`, which is set when STOP
  reaches the child (`Bundle.shutdown`), so cooperative code can finish at a
  safe point and return within the grace.
* **Hard:** when the child is hard-cancelled, the Trio side stops waiting
  (Trio's ``abandon_on_cancel``) and records the thread with
  `Bundle.note_abandoned`, so the `CancelReport` names it. The thread keeps
  its `ThreadBudget` token (and its `AdmissionGate` place) until it really
  ends, so abandoned threads still count against the limits.

Each call hands `trio.to_thread.run_sync` a small limiter of its own (a
`_ThreadCall`), which is how it learns exactly when its thread starts and
ends: Trio acquires the limiter before starting the thread and releases it,
in the Trio thread, once the thread has returned, even after abandonment.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, cast, final

import attrs
import trio

from .._core._checks import check_count, check_name, check_seconds, field_check
from .._core._lowlevel import NoPublicConstructor, is_async_def
from ._admission import AdmissionGate, BusyError
from ._parentbundle import bundle_of_caller

if TYPE_CHECKING:
    from typing_extensions import TypeVarTuple, Unpack

    from .._core._bundle import Bundle

    PosArgT = TypeVarTuple("PosArgT")

R = TypeVar("R")


@final
class StopFlag(metaclass=NoPublicConstructor):
    """Tells a thread run by `run_in_thread` that it should stop.

    A read-only `threading.Event`: it is set when STOP reaches the child that
    runs the thread (`Bundle.shutdown`), and at the latest when the thread is
    abandoned at a hard cancel. Poll `is_set` at safe points, or use `wait`
    as a sleep that ends early on STOP. Thread-safe.
    """

    __slots__ = ("_event",)

    def __init__(self, event: threading.Event) -> None:
        self._event = event

    def __repr__(self) -> str:
        state = "set" if self._event.is_set() else "clear"
        return f"<trio_graceful.StopFlag {state} at {id(self):#x}>"

    def is_set(self) -> bool:
        """Return True once the thread has been asked to stop."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block the calling thread until the flag is set or ``timeout`` passes.

        Call it from the thread, never from Trio code (it blocks).

        Args:
            timeout (float or None): Seconds to wait at most; `None` (or
                `math.inf`) waits until the flag is set.

        Returns:
            bool: True if the flag is set.

        Raises:
            TypeError: if ``timeout`` is not a number or None.
            ValueError: if ``timeout`` is negative or NaN.
        """
        if timeout is not None:
            timeout = check_seconds("timeout", timeout)
            if timeout > threading.TIMEOUT_MAX:
                timeout = None  # longer than the platform can wait: for ever
        return self._event.wait(timeout)


@attrs.frozen
class ThreadBudgetStatistics:
    """A snapshot of a `ThreadBudget`, returned by `ThreadBudget.statistics`."""

    total_tokens: int
    """How many threads may run at once."""

    threads_running: int
    """Threads holding a token now, abandoned ones included."""

    peak_threads_running: int
    """The most threads that held a token at once."""

    threads_abandoned: int
    """Threads still running whose caller was hard-cancelled and stopped
    waiting for them (they keep their token until they end)."""

    threads_abandoned_total: int
    """Threads abandoned since the budget was created, finished or not."""

    tasks_waiting: int
    """Calls waiting for a token."""


@final
@attrs.define(eq=False, repr=False)
class ThreadBudget:
    """At most ``total_tokens`` threads at once, telling which are abandoned.

    A thread limiter for `run_in_thread` (``budget=``) and
    `trio.to_thread.run_sync` (``limiter=``). A thread takes a token before
    it starts (the call waits for one, cancellably) and gives it back when
    it has really finished, which for an abandoned thread may be long after
    its caller was cancelled. That much holds for any `trio.CapacityLimiter`,
    Trio's default thread limiter included: `trio.to_thread.run_sync`
    releases the token only when the thread returns. What a budget adds is
    the accounting a `trio.CapacityLimiter` cannot do, since it does not
    know which of its borrowers were abandoned: `statistics` tells how many
    of the running threads are abandoned ones, how many were abandoned in
    all, and the most that ran at once.

    Put an `AdmissionGate` in front of each endpoint as well, so that a burst
    on one endpoint is refused at its gate instead of queueing for the
    tokens every endpoint shares. Like a `trio.CapacityLimiter`, a budget is
    used from the tasks of one Trio run.

    Args:
        total_tokens (int): How many threads may run at once (at least 1).

    Raises:
        TypeError: if ``total_tokens`` is not an int.
        ValueError: if ``total_tokens`` is less than 1.
    """

    _total_tokens: int = attrs.field(
        alias="total_tokens", validator=field_check(check_count)
    )
    _limiter: trio.CapacityLimiter = attrs.field(init=False)
    _peak: int = attrs.field(default=0, init=False)
    # Abandoned threads that have finished since (the running ones are
    # counted from the borrowers).
    _abandoned_finished: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        # After the validator: CapacityLimiter's own messages are vaguer.
        self._limiter = trio.CapacityLimiter(self._total_tokens)

    def __repr__(self) -> str:
        return (
            f"<trio_graceful.ThreadBudget {self._limiter.borrowed_tokens}/"
            f"{self.total_tokens} in use at {id(self):#x}>"
        )

    @property
    def total_tokens(self) -> int:
        """How many threads may run at once."""
        # The limiter's, which a budget sharing Trio's default one follows.
        return int(self._limiter.total_tokens)

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        """Take a token for ``borrower``, waiting until one is free.

        The method `trio.to_thread.run_sync` calls on its ``limiter`` before
        it starts a thread; `run_in_thread` calls it for you. This is a
        checkpoint.

        Raises:
            RuntimeError: if ``borrower`` already holds a token.
        """
        await self._limiter.acquire_on_behalf_of(borrower)
        self._peak = max(self._peak, self._limiter.borrowed_tokens)

    def release_on_behalf_of(self, borrower: object) -> None:
        """Give back ``borrower``'s token. Not a checkpoint.

        Raises:
            RuntimeError: if ``borrower`` holds no token.
        """
        self._limiter.release_on_behalf_of(borrower)
        if isinstance(borrower, _ThreadCall) and borrower.abandoned:
            self._abandoned_finished += 1

    def statistics(self) -> ThreadBudgetStatistics:
        """Return a `ThreadBudgetStatistics` snapshot. Not a checkpoint."""
        stats = self._limiter.statistics()
        abandoned = sum(
            1 for b in stats.borrowers if isinstance(b, _ThreadCall) and b.abandoned
        )
        return ThreadBudgetStatistics(
            total_tokens=self.total_tokens,
            threads_running=stats.borrowed_tokens,
            peak_threads_running=self._peak,
            threads_abandoned=abandoned,
            threads_abandoned_total=self._abandoned_finished + abandoned,
            tasks_waiting=stats.tasks_waiting,
        )


def share_default_thread_limiter(total_tokens: int | None) -> ThreadBudget:
    """Return a budget whose tokens are those of Trio's default thread limiter.

    Threads started with `trio.to_thread.run_sync` without a limiter (those
    of anyio and of the web frameworks on it) and those started under the
    budget then share one pool, of ``total_tokens`` if given. Not a
    checkpoint.
    """
    limiter = trio.to_thread.current_default_thread_limiter()
    if total_tokens is not None:
        limiter.total_tokens = total_tokens
    budget = ThreadBudget(int(limiter.total_tokens))
    budget._limiter = limiter  # pyright: ignore[reportPrivateUsage]
    return budget


@final
@attrs.define(eq=False)
class _ThreadCall:
    """One `run_in_thread` call, as the limiter `trio.to_thread.run_sync` sees."""

    limiter: ThreadBudget | trio.CapacityLimiter
    stop: threading.Event
    # The gate place this call holds, if any.
    gate: AdmissionGate | None = None
    # True from the moment the thread may start until it has returned.
    running: bool = False
    abandoned: bool = False

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        del borrower  # Trio's placeholder; the budget sees this call instead
        await self.limiter.acquire_on_behalf_of(self)
        self.running = True

    def release_on_behalf_of(self, borrower: object) -> None:
        del borrower
        self.running = False
        self.limiter.release_on_behalf_of(self)
        self.release_gate()

    def release_gate(self) -> None:
        if self.gate is not None:
            self.gate.release()
            self.gate = None


async def run_in_thread(
    sync_fn: Callable[[StopFlag, Unpack[PosArgT]], R],
    *args: Unpack[PosArgT],
    bundle: Bundle | None = None,
    name: str | None = None,
    budget: ThreadBudget | None = None,
    gate: AdmissionGate | None = None,
) -> R:
    """Run ``sync_fn(stop_flag, *args)`` in a thread, as a child of a bundle.

    Start it as a child (``bundle.start_soon(run_in_thread, fn)``) or call it
    from one. The bundle is the one the calling task is a child of, unless
    ``bundle=`` names it. The thread is told about a graceful shutdown and
    cannot hide from a hard one:

    * When STOP reaches the child (`Bundle.shutdown`), ``stop_flag`` (a
      `StopFlag`) is set. A function that checks it at safe points can
      finish its work and return within the grace.
    * When the child is hard-cancelled (the grace ran out, or anything else
      cancelled it), `run_in_thread` stops waiting at once and raises
      `trio.Cancelled`, like ``trio.to_thread.run_sync(...,
      abandon_on_cancel=True)``. A thread cannot be killed, so it runs on:
      the flag is set, the thread is recorded with `Bundle.note_abandoned`
      (``"thread 'name'"`` in `ChildEnd.abandoned` and
      `CancelReport.abandoned`), and it keeps its thread token and gate
      place until it returns. Its result or exception is then discarded.
      In the thread, `trio.from_thread.check_cancelled` raises once it has
      been abandoned.

    A function that needs no flag can ignore it: ``run_in_thread(lambda
    _flag: blocking_call(x))``.

    Every argument is checked before anything starts. This is a checkpoint,
    also when the gate refuses the call.

    Args:
        sync_fn: A synchronous function; it gets the `StopFlag` first.
        *args: More positional arguments for ``sync_fn``.
        bundle (Bundle or None): The bundle whose child calls this; `None`
            (the default) means the calling task's own bundle.
        name (str or None): The thread's name, also used in the report;
            defaults to ``"<function name> from <task name>"``.
        budget (ThreadBudget or None): The budget to take a token from;
            `None` uses Trio's default thread limiter.
        gate (AdmissionGate or None): A gate to pass first; it is held
            until the thread has finished.

    Returns:
        Whatever ``sync_fn`` returned.

    Raises:
        BusyError: if ``gate`` is full; nothing was started.
        RuntimeError: if the calling task is not a child of the bundle.
        TypeError: if ``sync_fn`` is not a synchronous function, or
            ``bundle``, ``name``, ``budget`` or ``gate`` has the wrong type.
        Exception: whatever ``sync_fn`` raised.
    """
    if not callable(cast("object", sync_fn)) or is_async_def(sync_fn):
        raise TypeError(f"sync_fn must be a synchronous function, not {sync_fn!r}")
    check_name("name", name)
    if budget is not None and not isinstance(cast("object", budget), ThreadBudget):
        raise TypeError(f"budget must be a ThreadBudget or None, not {budget!r}")
    if gate is not None and not isinstance(cast("object", gate), AdmissionGate):
        raise TypeError(f"gate must be an AdmissionGate or None, not {gate!r}")
    bundle = bundle_of_caller(bundle, "run_in_thread")
    if name is None:
        task_name = trio.lowlevel.current_task().name
        name = f"{getattr(sync_fn, '__name__', repr(sync_fn))} from {task_name}"

    stop = threading.Event()
    with bundle.on_stop(stop.set):
        return await call_in_thread(
            sync_fn,
            *args,
            name=name,
            budget=budget,
            gate=gate,
            stop=stop,
            on_abandoned=lambda: bundle.note_abandoned(f"thread {name!r}"),
        )


async def call_in_thread(
    sync_fn: Callable[[StopFlag, Unpack[PosArgT]], R],
    *args: Unpack[PosArgT],
    name: str,
    budget: ThreadBudget | None,
    gate: AdmissionGate | None,
    stop: threading.Event,
    on_abandoned: Callable[[], object],
) -> R:
    """The mechanism of `run_in_thread`, for callers that check their own arguments.

    ``sync_fn`` gets a `StopFlag` of ``stop``, which is also set when the
    thread is abandoned; ``on_abandoned`` is called then. This is a
    checkpoint.
    """
    limiter = (
        trio.to_thread.current_default_thread_limiter() if budget is None else budget
    )
    call = _ThreadCall(limiter, stop=stop)
    flag = StopFlag._create(stop)  # pyright: ignore[reportPrivateUsage]

    await trio.lowlevel.checkpoint_if_cancelled()
    if gate is not None:
        try:
            gate.acquire_nowait()
        except BusyError:
            await trio.lowlevel.cancel_shielded_checkpoint()
            raise
        call.gate = gate
    try:
        return await trio.to_thread.run_sync(
            sync_fn,
            flag,
            *args,
            thread_name=name,
            abandon_on_cancel=True,
            # Any object with the two limiter methods will do.
            limiter=cast("trio.CapacityLimiter", call),
        )
    except BaseException:
        if call.running:
            call.abandoned = True
            stop.set()
            on_abandoned()
        raise
    finally:
        if not call.running:
            # The thread never started (or has finished and let go already).
            call.release_gate()
