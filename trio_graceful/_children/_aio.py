"""asyncio code as children of a bundle, through trio-asyncio.

`run_asyncio` runs an asyncio coroutine function as an `asyncio.Task` on
the trio-asyncio loop and waits for it from the Trio side, so it behaves
like any other child: its result is returned, its exception raised, STOP
reaches it through an `AsyncioInbox`, and a hard cancel cancels the task.

asyncio's cancellation is edge-triggered: `asyncio.Task.cancel` throws one
`asyncio.CancelledError`, and code that catches it may carry on and wait
again, for ever. Trio's is level-triggered: once a scope is cancelled,
every checkpoint in it raises. A child must obey the bundle's hard deadline,
so after a hard cancel the task's coroutine is driven by `_refusing_waits`,
which cancels every further wait it starts (asyncio code then sees a
`asyncio.CancelledError` at each ``await`` that would block, as Trio code sees
`trio.Cancelled`). Awaits of things already done, and code between awaits,
still run, so ``finally`` blocks and ``except CancelledError`` clauses
unwind as usual.

Refusing cannot end a task that catches every `asyncio.CancelledError` and
waits again, in a loop: it would spin on refused waits for ever, and the
bundle's deadline would not hold. After 100 refused waits (honest unwinding
needs a few), `run_asyncio` stops waiting and reports the task abandoned,
as a thread is abandoned at the hard cancel; the task runs on, its waits no
longer refused.

trio-asyncio is imported only when this module's functions are used: it
patches asyncio's loop policy when imported, and it is an optional
dependency (the ``asyncio`` extra).
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import functools
import importlib
import inspect
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast, final

import attrs
import trio

from .._core._inbox import InboxReceiver
from .._core._lowlevel import NoPublicConstructor
from .._core._stop import STOP, StopType
from ._parentbundle import bundle_of_caller

if TYPE_CHECKING:
    from typing_extensions import Self, TypeVarTuple, Unpack

    from .._core._bundle import Bundle

    PosArgT = TypeVarTuple("PosArgT")

T = TypeVar("T")
R = TypeVar("R")


class _TrioAsyncio(Protocol):
    """The parts of the trio_asyncio module used here (it ships no types)."""

    current_loop: contextvars.ContextVar[asyncio.AbstractEventLoop | None]

    def aio_as_trio(
        self, proc: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Any]]: ...

    def trio_as_aio(
        self, proc: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Any]]: ...


def _trio_asyncio() -> _TrioAsyncio:
    try:
        module = importlib.import_module("trio_asyncio")
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "running asyncio code in a bundle needs trio-asyncio; install it "
            "with the 'asyncio' extra: pip install 'trio-graceful[asyncio]'"
        ) from exc
    return cast("_TrioAsyncio", module)


@final
class AsyncioInbox(Generic[T], metaclass=NoPublicConstructor):
    """An `InboxReceiver` for asyncio code: what `run_asyncio` passes in.

    Its methods are asyncio-flavoured: call them from the asyncio function
    that `run_asyncio` runs (or from asyncio tasks it starts), never from
    Trio code. ``async for message in inbox`` ends at `STOP` or when every
    sender is closed; `stop_received` tells which, as for an
    `InboxReceiver`.
    """

    __slots__ = ("_receiver",)

    def __init__(self, receiver: InboxReceiver[T]) -> None:
        self._receiver = receiver

    def __repr__(self) -> str:
        return f"<trio_graceful.AsyncioInbox for {self._receiver!r}>"

    @property
    def stop_received(self) -> bool:
        """True once `STOP` has been received."""
        return self._receiver.stop_received

    async def receive(self) -> T | StopType:
        """Return the next message, or `STOP`, waiting until there is one.

        As `InboxReceiver.receive`, and as safe to cancel (with
        `asyncio.Task.cancel` or `asyncio.timeout`): a message is either
        returned or left in the inbox.

        Raises:
            trio.EndOfChannel: if every sender is closed and the inbox is empty.
            trio.ClosedResourceError: if the receiver was closed.
        """
        receive = _trio_asyncio().trio_as_aio(self._receiver.receive)
        return cast("T | StopType", await receive())

    async def until_stop(
        self,
        aio_fn: Callable[[Unpack[PosArgT]], Awaitable[R]],
        *args: Unpack[PosArgT],
    ) -> R | StopType:
        """Run ``await aio_fn(*args)`` until it returns or `STOP` is next here.

        As `InboxReceiver.until_stop`, for an asyncio operation: when STOP is
        next, ``aio_fn``'s task is cancelled and STOP is returned. The
        operation must be cancel-safe (cancelled, it returns what it took, or
        takes nothing), as ``websocket.recv()`` of the websockets library and
        `asyncio.Queue.get` are.

        Returns:
            What ``aio_fn`` returned, or `STOP`.

        Raises:
            TypeError: if ``aio_fn`` is not callable.
            trio.ClosedResourceError: if the receiver was closed.
        """
        if not callable(cast("object", aio_fn)):
            raise TypeError(f"aio_fn must be an async function, not {aio_fn!r}")
        trio_asyncio = _trio_asyncio()
        until_stop = trio_asyncio.trio_as_aio(self._receiver.until_stop)
        return cast(
            "R | StopType", await until_stop(trio_asyncio.aio_as_trio(aio_fn), *args)
        )

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T:
        """Return the next message; end the iteration at STOP or end-of-channel."""
        try:
            message = await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        if message is STOP:
            raise StopAsyncIteration
        return message


# How many waits a hard-cancelled task may start, each refused, before it
# is taken to ignore its cancellation. Unwinding through finally blocks and
# except clauses takes a few; only a loop that swallows CancelledError
# takes this many.
_REFUSED_WAITS_BEFORE_ABANDONING = 100


class _Phase(enum.Enum):
    """Where a `run_asyncio` task is in its cancellation."""

    RUNNING = "running"  # not hard-cancelled: its waits pass through
    REFUSING = "refusing"  # hard-cancelled: each new wait is cancelled
    ABANDONED = "abandoned"  # ignored that: run_asyncio stopped waiting for it


@attrs.define(eq=False)
class _TaskWatch:
    """The Trio side of one `run_asyncio` task: its phase and its waiter."""

    waiter: trio.lowlevel.Task
    phase: _Phase = _Phase.RUNNING
    refused: int = 0

    def hard_cancel(self) -> None:
        if self.phase is _Phase.RUNNING:
            self.phase = _Phase.REFUSING

    def refuse(self) -> bool:
        """Tell whether to cancel a wait the task starts; abandon it past the limit.

        A task that goes on waiting after so many refusals catches its
        cancellations and carries on, maybe in a loop: the waiter stops
        waiting for it, and the task runs on unrefused, like an abandoned
        thread, instead of spinning on refused waits.
        """
        if self.phase is not _Phase.REFUSING:
            return False
        if self.refused < _REFUSED_WAITS_BEFORE_ABANDONING:
            self.refused += 1
            return True
        self.phase = _Phase.ABANDONED
        trio.lowlevel.reschedule(self.waiter)
        return False

    def task_done(self, task: asyncio.Future[Any]) -> None:
        if self.phase is not _Phase.ABANDONED:
            trio.lowlevel.reschedule(self.waiter)
        elif not task.cancelled():
            # Nobody waits for it any more; its outcome is discarded, as an
            # abandoned thread's is, without asyncio's "never retrieved" log.
            task.exception()


def _cancel_wait(awaited: object) -> bool:
    """Cancel what a coroutine yielded to its Task; False if nothing was cancelled."""
    cancel = getattr(awaited, "cancel", None)
    return callable(cancel) and bool(cancel())


@types.coroutine
def _refusing_waits(
    coro: Coroutine[Any, Any, R], watch: _TaskWatch
) -> Generator[Any, Any, R]:
    """Drive ``coro`` for its Task, cancelling the waits ``watch`` refuses.

    A coroutine waits by yielding a future (or None, for ``asyncio.sleep(0)``)
    up to its Task. After a hard cancel, a yielded future is cancelled before
    it is passed on, so the Task wakes the coroutine with its outcome: a
    `asyncio.CancelledError`, or the result of an operation that completed anyway
    (cancel-safe operations must not lose it). Anything that cannot be
    cancelled gets an `asyncio.CancelledError` thrown in at once.
    """
    send: Callable[[Any], Any] = coro.send
    value: Any = None
    while True:
        try:
            awaited = send(value)
        except StopIteration as stop:
            return cast("R", stop.value)
        if watch.refuse() and not _cancel_wait(awaited):
            send, value = coro.throw, asyncio.CancelledError()
            continue
        try:
            value = yield awaited
        except BaseException as exc:
            send, value = coro.throw, exc
        else:
            send = coro.send


async def run_asyncio(
    aio_fn: Callable[[AsyncioInbox[Any], Unpack[PosArgT]], Awaitable[R]],
    *args: Unpack[PosArgT],
    bundle: Bundle | None = None,
    inbox: InboxReceiver[Any] | None = None,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> R:
    """Run ``await aio_fn(asyncio_inbox, *args)`` on asyncio, as a child of a bundle.

    ``aio_fn`` is an asyncio coroutine function; it runs as an
    `asyncio.Task` on the trio-asyncio loop, which must be open around the
    bundle (``async with trio_asyncio.open_loop():``). Start it like a Trio
    child, ``bundle.start_soon(run_asyncio, aio_fn, arg)``, or await it from
    one; the bundle is the one the calling task is a child of, unless
    ``bundle=`` names it. It follows the bundle's rules:

    * Its first argument is an `AsyncioInbox`, the asyncio face of
      ``inbox``: an inbox of the bundle that you opened and send messages
      to, or, by default, a new inbox of the bundle that only ever
      carries STOP. Either way `Bundle.shutdown` reaches the asyncio code
      as STOP.
    * A hard cancel (the grace ran out, or anything else cancelled the
      caller) cancels the task: the asyncio code sees `asyncio.CancelledError`
      and unwinds through its ``finally`` blocks, then `run_asyncio` raises
      `trio.Cancelled`. From then on every wait the task starts is cancelled
      too, so a task that catches `asyncio.CancelledError` and tries to go
      on still ends by the deadline. Graceful work (a protocol's goodbye)
      belongs after STOP, not in the cleanup after a hard cancel.
    * A task that still goes on waiting after 100 refused waits ignores its
      cancellation (it catches `asyncio.CancelledError` in a loop):
      `run_asyncio` stops waiting for it and raises `trio.Cancelled`, so the
      bundle's deadline holds. The task is *abandoned*, as a thread is: it
      is recorded with `Bundle.note_abandoned` (``"asyncio task 'name'"`` in
      `ChildEnd.abandoned`), its waits are no longer refused, and its result
      or exception is discarded.
    * Its result is returned and its exception raised, as a Trio child's.

    When started with ``await bundle.start(run_asyncio, aio_fn, ...)``,
    ``aio_fn`` also gets the ``task_status`` keyword argument, and calls
    ``task_status.started(value)`` from asyncio code when it is ready.

    Asyncio tasks that ``aio_fn`` creates itself are not part of the bundle;
    the trio-asyncio loop cancels those left over when it closes.

    Every argument is checked before anything starts. This is a checkpoint.

    Args:
        aio_fn: An asyncio coroutine function.
        *args: More positional arguments for ``aio_fn``.
        bundle (Bundle or None): The bundle whose child calls this; `None`
            (the default) means the calling task's own bundle.
        inbox (InboxReceiver or None): The inbox to hand over, opened with
            ``bundle.open_inbox()``; by default a new one.
        task_status: Given by `Bundle.start`; passed on to ``aio_fn``.

    Returns:
        What ``aio_fn`` returned.

    Raises:
        RuntimeError: if the calling task is not a child of the bundle, or
            no trio-asyncio loop is running.
        ModuleNotFoundError: if trio-asyncio is not installed.
        TypeError: if ``aio_fn`` is not callable or does not return a
            coroutine, or ``bundle`` or ``inbox`` has the wrong type.
        Exception: whatever ``aio_fn`` raised.
    """
    if not callable(cast("object", aio_fn)):
        raise TypeError(f"aio_fn must be an async function, not {aio_fn!r}")
    if inbox is not None and not isinstance(cast("object", inbox), InboxReceiver):
        raise TypeError(f"inbox must be an InboxReceiver or None, not {inbox!r}")
    bundle = bundle_of_caller(bundle, "run_asyncio")
    loop = _trio_asyncio().current_loop.get()
    if loop is None or loop.is_closed():
        raise RuntimeError(
            "run_asyncio() needs a running trio-asyncio loop: open one around "
            "the bundle with 'async with trio_asyncio.open_loop():'"
        )
    fn = cast("Callable[..., Awaitable[R]]", aio_fn)
    if task_status is not trio.TASK_STATUS_IGNORED:
        fn = functools.partial(fn, task_status=task_status)
    if inbox is not None:
        aio_inbox = AsyncioInbox[Any]._create(inbox)  # pyright: ignore[reportPrivateUsage]
        return await _run_task(bundle, loop, fn, aio_inbox, args)
    sender, receiver = bundle.open_inbox()
    with sender, receiver:
        aio_inbox = AsyncioInbox[Any]._create(receiver)  # pyright: ignore[reportPrivateUsage]
        return await _run_task(bundle, loop, fn, aio_inbox, args)


async def _run_task(
    bundle: Bundle,
    loop: asyncio.AbstractEventLoop,
    aio_fn: Callable[..., Awaitable[R]],
    aio_inbox: AsyncioInbox[Any],
    args: tuple[object, ...],
) -> R:
    me = trio.lowlevel.current_task()
    watch = _TaskWatch(me)

    async def task_body() -> R:
        coro: object = aio_fn(aio_inbox, *args)
        if not inspect.iscoroutine(coro):
            raise TypeError(
                f"run_asyncio expected an asyncio coroutine function, but "
                f"{aio_fn!r} returned {coro!r}"
            )
        return await _refusing_waits(cast("Coroutine[Any, Any, R]", coro), watch)

    task = loop.create_task(task_body(), name=me.name)
    task.add_done_callback(watch.task_done)
    raise_cancel: Callable[[], object] | None = None

    def abort(raise_cancel_arg: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
        nonlocal raise_cancel
        raise_cancel = raise_cancel_arg
        watch.hard_cancel()
        task.cancel()
        # Keep waiting: the task has its CancelledError to unwind.
        return trio.lowlevel.Abort.FAILED

    await trio.lowlevel.wait_task_rescheduled(abort)
    if watch.phase is _Phase.ABANDONED:
        bundle.note_abandoned(f"asyncio task {task.get_name()!r}")
    if raise_cancel is not None and (task.cancelled() or not task.done()):
        raise_cancel()
    return task.result()
