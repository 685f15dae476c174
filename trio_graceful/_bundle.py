"""Bundles: nurseries whose children can be cancelled with a grace period.

Shape of a bundle (``async with open_bundle() as bundle: BODY``)::

    outer nursery (bundle.cancel_scope)         <- the body runs here
    └── host task
        └── inner nursery (the children's scope) <- every child runs here

The children live in a nursery of their own, opened by a small host task, so
that the hard deadline of `Bundle.cancel` can be put on *their* cancel scope
alone: when the grace runs out the children are cancelled and the body goes
on. Everything else mirrors a plain nursery: cancelling ``bundle.cancel_scope``
cancels body and children, a child's exception cancels its siblings and the
body at once, and the exception group that leaves the bundle has the shape a
plain nursery's would.
"""

from __future__ import annotations

import collections.abc
import contextlib
import functools
import logging
import math
import sys
import weakref
from collections.abc import Callable, Generator
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast, final

import attrs
import trio

from ._inbox import InboxReceiver, InboxSender, InboxState, open_inbox_with_state
from ._report import BundleStatistics, CancelReport, ChildEnd, ChildOutcome
from ._trace import (
    TraceKind,
    bundle_path,
    emit,
    enclosing_bundle_path,
    logger,
    register_bundle,
    task_path,
    tracing,
    unregister_bundle,
)
from ._util import (
    ForwardingTaskStatus,
    NoPublicConstructor,
    as_group,
    check_name,
    check_seconds,
    first_leaf,
    in_trio_run,
    is_async_def,
)

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from typing_extensions import TypeVarTuple, Unpack

    PosArgT = TypeVarTuple("PosArgT")


# How often a long cancellation logs that it is still waiting, in seconds.
PROGRESS_INTERVAL = 2.0


def is_cancellation(exc: BaseException) -> bool:
    """True if ``exc`` is `trio.Cancelled`, or a group holding only Cancelled."""
    if isinstance(exc, trio.Cancelled):
        return True
    group = as_group(exc)
    return group is not None and group.split(trio.Cancelled)[1] is None


def check_child_of(bundle: Bundle, caller: str) -> None:
    """Raise `RuntimeError` unless the current task is a child of ``bundle``.

    ``caller`` names the public function for the message.
    """
    task = trio.lowlevel.current_task()
    if task not in bundle:
        raise RuntimeError(
            f"{caller}() must be called by a child of bundle {bundle.name!r} "
            f"(a task started with its start_soon() or start()), not by {task!r}"
        )


def _given(coro: Awaitable[object]) -> Awaitable[object]:
    return coro


def _prepare(
    async_fn: Callable[..., Awaitable[object]], args: tuple[object, ...]
) -> tuple[Callable[..., Awaitable[object]], tuple[object, ...]]:
    """Check an ``async_fn`` that is not a plain ``async def`` function now.

    `Bundle.start_soon` recognises ``async def`` functions (also bound
    methods) from their code flags and calls them later, in the child. Other
    callables are called here, as `trio.Nursery.start_soon` does, so that
    mistakes raise in the caller; they must return a coroutine.
    """
    candidate: object = async_fn
    if isinstance(candidate, functools.partial):
        partial = cast("functools.partial[object]", candidate)
        if is_async_def(partial.func):
            return async_fn, args
    if isinstance(candidate, collections.abc.Coroutine):
        coro_object = cast(
            "collections.abc.Coroutine[object, object, object]", candidate
        )
        coro_object.close()
        raise TypeError(
            f"start_soon expected an async function, not the coroutine object "
            f"{coro_object!r}; pass the function and its arguments instead: "
            f"start_soon(fn, *args)"
        )
    if not callable(cast("object", async_fn)):
        raise TypeError(f"start_soon expected an async function, not {async_fn!r}")
    coro: object = async_fn(*args)
    if not isinstance(coro, collections.abc.Coroutine):
        raise TypeError(
            f"start_soon expected an async function, but {async_fn!r} returned "
            f"{coro!r} instead of a coroutine; is it missing 'async'?"
        )
    return _given, (cast("collections.abc.Coroutine[object, object, object]", coro),)


@attrs.define(eq=False)
class _ChildNotes:
    abandoned: list[str] = attrs.field(factory=list[str])
    notes: list[str] = attrs.field(factory=list[str])


@attrs.define(eq=False)
class _Cancellation:
    """The record of a bundle's cancellation, shared by every cancel() caller."""

    started_at: float
    all_done: trio.Event = attrs.field(factory=trio.Event)
    ended: list[ChildEnd] = attrs.field(factory=list[ChildEnd])
    report: CancelReport | None = None
    # The first caller waits on this scope so that it can wake at the hard
    # deadline (for the trace) and now and then to log progress; the scope's
    # deadline follows the bundle's. None when nobody drives.
    driver: trio.CancelScope | None = None
    hard_cancel_traced: bool = False


@final
@attrs.define(eq=False, repr=False, slots=False)
class Bundle(metaclass=NoPublicConstructor):
    """A nursery whose children can be cancelled gracefully. See `open_bundle`.

    A bundle can stand in for a `trio.Nursery`: it has `start_soon`, `start`,
    `cancel_scope`, `child_tasks` and `parent_task`, so it can be passed as
    ``handler_nursery`` to `trio.serve_tcp`, `trio.serve_listeners` or
    trio-websocket's ``serve_websocket``. (Those functions annotate the
    argument as `trio.Nursery`, a class nothing else can be; for a type
    checker, write ``handler_nursery=typing.cast(trio.Nursery, bundle)``.)
    Its own operations are `cancel`, `shutdown`, `open_inbox`, `on_stop` and
    `statistics`.
    """

    _name: str
    _path: str
    _outer: trio.Nursery
    _inner: trio.Nursery
    _token: trio.lowlevel.TrioToken
    # Children started and not yet ended, including those still starting.
    _live: int = 0
    _closed: bool = False
    _closed_reason: str = ""
    _hard_deadline: float = math.inf
    # When the children were hard-cancelled (explicitly, or by a failing
    # child); a deadline that expired is recognised from the scope.
    _hard_cancelled_at: float | None = None
    # Created by the first cancel() call.
    _cancellation: _Cancellation | None = None
    # Scopes around children still starting under start(): they are not yet
    # under the inner nursery's scope, so deadlines and hard cancels go to
    # them one by one.
    _start_scopes: set[trio.CancelScope] = attrs.field(factory=set[trio.CancelScope])
    _inboxes: weakref.WeakSet[InboxState[Any]] = attrs.field(
        factory=weakref.WeakSet[InboxState[Any]]
    )
    _stopping: bool = False
    # Callbacks registered with on_stop(), {key: (registering task, callback)}.
    _stop_callbacks: dict[object, tuple[trio.lowlevel.Task, Callable[[], object]]] = (
        attrs.field(
            factory=dict[object, tuple[trio.lowlevel.Task, Callable[[], object]]]
        )
    )
    # What children recorded with note() and note_abandoned(), until they end.
    _notes: dict[trio.lowlevel.Task, _ChildNotes] = attrs.field(
        factory=dict[trio.lowlevel.Task, "_ChildNotes"]
    )

    def __repr__(self) -> str:
        state = (
            "closed" if self._closed else "cancelling" if self.cancelling else "open"
        )
        return (
            f"<trio_graceful.Bundle {self._name!r} {state}, "
            f"{self._live} children at {id(self):#x}>"
        )

    # -- the trio.Nursery surface -------------------------------------------

    @property
    def name(self) -> str:
        """The bundle's name, used in reports, task names and traces."""
        return self._name

    @property
    def path(self) -> str:
        """The bundle's place in the tree of bundles and tasks.

        A bundle opened in the body of bundle ``root`` is ``root/name``; one
        opened by ``root``'s child task ``conn-1`` is ``root/conn-1/name``; one
        opened outside any bundle is just its `name`. Trace events name tasks
        the same way: ``root/conn-1/name/request-7``.
        """
        return self._path

    @property
    def cancel_scope(self) -> trio.CancelScope:
        """The scope around the body and the children, as `trio.Nursery.cancel_scope`.

        Cancelling it hard-cancels everything at once, body included.
        """
        return self._outer.cancel_scope

    @property
    def child_tasks(self) -> frozenset[trio.lowlevel.Task]:
        """The children still running, as `trio.Nursery.child_tasks`."""
        return self._inner.child_tasks

    @property
    def parent_task(self) -> trio.lowlevel.Task:
        """The task that opened the bundle, as `trio.Nursery.parent_task`."""
        return self._outer.parent_task

    def start_soon(
        self,
        async_fn: Callable[[Unpack[PosArgT]], Awaitable[object]],
        *args: Unpack[PosArgT],
        name: object = None,
    ) -> None:
        """Start ``await async_fn(*args)`` as a child, like `trio.Nursery.start_soon`.

        A child started while the bundle is cancelling gets the same hard
        deadline and is waited for by `cancel`. Not a checkpoint.

        Args:
            async_fn: An async function.
            *args: Positional arguments for ``async_fn``.
            name: The task's name, as in `trio.Nursery.start_soon`.

        Raises:
            RuntimeError: if the bundle is closed: `cancel` has finished, or
                the ``async with`` block has exited and every child has ended.
            TypeError: if ``async_fn`` is not an async function.
        """
        if self._closed:
            raise RuntimeError(self._closed_reason)
        if name is None:
            name = async_fn
        if not is_async_def(async_fn):
            async_fn, args = _prepare(async_fn, args)  # type: ignore[assignment]
        self._inner.start_soon(self._run_child, async_fn, args, name=name)
        self._live += 1

    async def start(
        self,
        async_fn: Callable[..., Awaitable[object]],
        *args: object,
        name: object = None,
    ) -> Any:
        """Start a child and wait until it is ready, like `trio.Nursery.start`.

        ``async_fn`` must take a ``task_status`` keyword argument and call
        ``task_status.started(value)``; `start` returns ``value``. Until then
        the child runs under the caller and its exceptions go to the caller.
        A child started while the bundle is cancelling gets the same hard
        deadline, also before it is ready. This is a checkpoint.

        Raises:
            RuntimeError: if the bundle is closed, if the child returned
                without calling ``task_status.started()``, or if the bundle
                was hard-cancelled before the child was ready.
        """
        if self._closed:
            raise RuntimeError(self._closed_reason)
        self._live += 1
        return await self._inner.start(
            self._run_starting_child,
            async_fn,
            args,
            name=async_fn if name is None else name,
        )

    # -- graceful cancellation ------------------------------------------------

    @property
    def hard_deadline(self) -> float:
        """The children's hard deadline in Trio time; `math.inf` if not cancelling.

        Children see it through `trio.current_effective_deadline`, together
        with any earlier deadline of the scopes around the bundle.
        """
        return self._hard_deadline

    @property
    def cancelling(self) -> bool:
        """True once `cancel` (or `shutdown`) has been called."""
        return self._cancellation is not None

    @property
    def closed(self) -> bool:
        """True once the bundle accepts no new children."""
        return self._closed

    async def cancel(self, grace: float) -> CancelReport:
        """Cancel the children, giving them ``grace`` seconds to finish first.

        Waits for every child (not the body of the ``async with`` block) and
        returns the moment the last one ends. If some are still running
        ``grace`` seconds after the call, they are hard-cancelled (Trio
        cancellation) and `cancel` returns once they have unwound. The body is
        not cancelled and goes on afterwards; the bundle is then closed.

        Calling `cancel` again, or from several tasks, is allowed: a shorter
        grace moves the hard deadline earlier, never later, and every caller
        returns when the children are done (the same report for all).

        This is a checkpoint. If the calling task is cancelled while it waits,
        every child is hard-cancelled at once and the caller gets its
        `trio.Cancelled` as usual.

        Args:
            grace (float): Seconds to wait before the hard cancel; 0 hard-cancels
                at once, `math.inf` waits as long as it takes.

        Returns:
            CancelReport: What each child did and when.

        Raises:
            TypeError: if ``grace`` is not a number.
            ValueError: if ``grace`` is negative or NaN.
            RuntimeError: if called from another thread or Trio run, or from a
                task inside this bundle (it would wait for itself).
        """
        grace = check_seconds("grace", grace)
        self._check_caller("cancel")
        return await self._cancel(grace)

    async def shutdown(self, grace: float) -> CancelReport:
        """Send `STOP` to every inbox of this bundle, then `cancel` with ``grace``.

        The inboxes opened with `open_inbox` get STOP behind the messages
        already queued; an inbox opened after this call gets STOP at once.
        This is a checkpoint; see `cancel` for the rest.

        Args:
            grace (float): As for `cancel`.

        Returns:
            CancelReport: As for `cancel`.

        Raises:
            TypeError, ValueError, RuntimeError: As for `cancel`.
        """
        grace = check_seconds("grace", grace)
        self._check_caller("shutdown")
        if not self._stopping:
            self._stopping = True
            for state in list(self._inboxes):
                state.stop()
            for task, callback in list(self._stop_callbacks.values()):
                self._call_on_stop(task, callback)
        return await self._cancel(grace)

    @contextlib.contextmanager
    def on_stop(self, callback: Callable[[], object]) -> Generator[None, None, None]:
        """Call ``callback()`` if `shutdown` begins while the block runs.

        For work that cannot read an inbox, such as a thread or a
        subprocess: the callback passes STOP on in its own terms (sets a flag,
        sends a signal). If the shutdown has begun already, the callback is
        called at once. It is called synchronously, from the task that calls
        `shutdown`, and must not block; if it raises, the error is logged to
        the ``trio_graceful`` logger and the shutdown goes on. Not a
        checkpoint.

        Use it as ``with bundle.on_stop(flag.set): ...``. Each call of the
        callback is traced as STOP received by the task that registered it.
        """
        task = trio.lowlevel.current_task()
        if self._stopping:
            self._call_on_stop(task, callback)
            yield
            return
        key = object()
        self._stop_callbacks[key] = (task, callback)
        try:
            yield
        finally:
            self._stop_callbacks.pop(key, None)

    def _call_on_stop(
        self, task: trio.lowlevel.Task, callback: Callable[[], object]
    ) -> None:
        if tracing.active:
            emit(
                TraceKind.STOP_RECEIVED,
                enclosing_bundle_path(task, bodies=False),
                task_path(task),
            )
        try:
            callback()
        except Exception:
            logger.exception(
                "on_stop callback %r of bundle %r raised", callback, self._path
            )

    def __contains__(self, task: object) -> bool:
        """``task in bundle``: is ``task`` a child of this bundle?

        Children still starting under `start` count too. Like ``task in
        bundle.child_tasks`` without copying the set. Not a checkpoint.
        """
        return isinstance(task, trio.lowlevel.Task) and (
            task.parent_nursery is self._inner
            or task.eventual_parent_nursery is self._inner
        )

    def open_inbox(
        self, max_buffer_size: int | float = 0
    ) -> tuple[InboxSender[Any], InboxReceiver[Any]]:
        """Open an inbox that `shutdown` will stop. Not a checkpoint.

        Give the receiver to a child; `shutdown` queues `STOP` on it behind
        the messages already sent. Annotate the two variables to fix the
        message type: ``tx: InboxSender[Job]``.

        Args:
            max_buffer_size (int or math.inf): As for `open_inbox`.

        Raises:
            TypeError, ValueError: for a bad ``max_buffer_size``.
            RuntimeError: if the bundle is closed.
        """
        if self._closed:
            raise RuntimeError(self._closed_reason)
        sender: InboxSender[Any]
        receiver: InboxReceiver[Any]
        state: InboxState[Any]
        sender, receiver, state = open_inbox_with_state(max_buffer_size)
        state.owner = self._path
        self._inboxes.add(state)
        state.on_receivers_closed = self._inboxes.discard
        if self._stopping:
            state.stop()
        return sender, receiver

    def statistics(self) -> BundleStatistics:
        """Return a `BundleStatistics` snapshot. Not a checkpoint."""
        return BundleStatistics(
            children_running=self._live,
            cancelling=self.cancelling,
            closed=self._closed,
            hard_deadline=self._hard_deadline,
            inboxes=len(self._inboxes),
        )

    # -- internals --------------------------------------------------------------

    def _check_caller(self, method: str) -> None:
        if not in_trio_run(self._token):
            raise RuntimeError(
                f"Bundle.{method}() must be called from the Trio run that owns "
                f"bundle {self._name!r}; from another thread use "
                f"trio.from_thread.run(bundle.{method}, grace)"
            )
        # Walk up Trio's task tree to the task that runs the body: a caller
        # inside the bundle passes through its children's nursery on the way.
        body = self._outer.parent_task
        task = trio.lowlevel.current_task()
        while task is not body:
            nursery = task.parent_nursery or task.eventual_parent_nursery
            if nursery is None:
                break
            if nursery is self._inner:
                caller = trio.lowlevel.current_task()
                raise RuntimeError(
                    f"Bundle.{method}() was called from {caller!r}, "
                    f"which runs inside bundle {self._name!r} and would wait for "
                    f"itself; call it from the task that owns the bundle, or use "
                    f"bundle.cancel_scope.cancel() for a hard cancel"
                )
            task = nursery.parent_task

    async def _cancel(self, grace: float) -> CancelReport:
        now = trio.current_time()
        cancellation = self._cancellation
        if cancellation is None:
            cancellation = self._cancellation = _Cancellation(started_at=now)
        deadline = now + grace
        if deadline < self._hard_deadline:
            self._hard_deadline = deadline
            self._inner.cancel_scope.deadline = deadline
            for scope in self._start_scopes:
                scope.deadline = deadline
            if cancellation.driver is not None:
                cancellation.driver.deadline = min(
                    cancellation.driver.deadline, deadline
                )
        if tracing.active:
            emit(
                TraceKind.CANCEL_STARTED,
                self._path,
                task_path(trio.lowlevel.current_task()),
                grace=grace,
                deadline=self._hard_deadline,
            )
        if self._live == 0 and cancellation.report is None:
            self._finish_cancel(cancellation)
        try:
            if cancellation.driver is None and cancellation.report is None:
                await self._drive(cancellation)
            else:
                await cancellation.all_done.wait()
        except BaseException:
            self._hard_cancel(
                f"the task waiting in cancel() of bundle {self._name!r} was cancelled"
            )
            raise
        assert cancellation.report is not None
        return cancellation.report

    async def _drive(self, cancellation: _Cancellation) -> None:
        """Wait for the children; meanwhile trace the deadline, log progress.

        Without trace hooks and with progress logging off this is a single
        wait: the caller is woken by the last child, never by a timer.
        """
        level = self._log_level()
        progress_due = (
            trio.current_time() + PROGRESS_INTERVAL
            if logger.isEnabledFor(level)
            else math.inf
        )
        scope = cancellation.driver = trio.CancelScope()
        try:
            while not cancellation.all_done.is_set():
                deadline = progress_due
                if tracing.active and not cancellation.hard_cancel_traced:
                    deadline = min(deadline, self._hard_deadline)
                scope.deadline = deadline
                with scope:
                    await cancellation.all_done.wait()
                if cancellation.all_done.is_set():
                    return
                scope = cancellation.driver = trio.CancelScope()
                now = trio.current_time()
                if now >= self._hard_deadline:
                    self._trace_hard_cancel("the grace period ran out")
                if now >= progress_due:
                    progress_due = now + PROGRESS_INTERVAL
                    left = self._hard_deadline - now
                    logger.log(
                        level,
                        "bundle %r: waiting for %d %s, %s of grace left",
                        self._path,
                        self._live,
                        "child" if self._live == 1 else "children",
                        f"{left:.1f} s" if left > 0 else "none",
                    )
        finally:
            cancellation.driver = None

    def _log_level(self) -> int:
        # A shutdown of the whole program is news; the many small bundles
        # inside it (one per connection, say) are details.
        return logging.INFO if "/" not in self._path else logging.DEBUG

    def _hard_cancel(self, reason: str) -> None:
        if self._hard_cancelled_at is None:
            self._hard_cancelled_at = trio.current_time()
        self._trace_hard_cancel(reason)
        self._inner.cancel_scope.cancel(reason)
        for scope in self._start_scopes:
            scope.cancel(reason)

    def _trace_hard_cancel(self, reason: str) -> None:
        cancellation = self._cancellation
        if cancellation is None or cancellation.hard_cancel_traced:
            return
        cancellation.hard_cancel_traced = True
        if tracing.active:
            emit(
                TraceKind.HARD_CANCEL,
                self._path,
                deadline=self._hard_deadline,
                detail=reason,
            )

    def _finish_cancel(self, cancellation: _Cancellation) -> None:
        self._close(f"bundle {self._name!r} is closed: cancel() has finished")
        hard_cancelled_at = self._hard_cancelled_at
        if hard_cancelled_at is None and self._inner.cancel_scope.cancel_called:
            hard_cancelled_at = self._hard_deadline
        cancellation.report = CancelReport(
            bundle=self._name,
            started_at=cancellation.started_at,
            finished_at=trio.current_time(),
            hard_deadline=self._hard_deadline,
            hard_cancelled_at=hard_cancelled_at,
            children=tuple(cancellation.ended),
        )
        summary = cancellation.report.summary()
        logger.log(self._log_level(), "%s", summary)
        if tracing.active:
            emit(TraceKind.CANCEL_FINISHED, self._path, detail=summary)
        cancellation.all_done.set()

    def _close(self, reason: str) -> None:
        if not self._closed:
            self._closed = True
            self._closed_reason = f"{reason}; no new tasks can be started"

    def _opened(self) -> None:
        register_bundle(self._path, self.parent_task, (self._outer, self._inner))
        if tracing.active:
            emit(TraceKind.BUNDLE_OPENED, self._path)

    def _block_exited(self) -> None:
        self._close(f"bundle {self._name!r} is closed: its block has exited")
        unregister_bundle(self._path, self.parent_task, (self._outer, self._inner))
        if tracing.active:
            emit(TraceKind.BUNDLE_CLOSED, self._path)

    def note(self, text: str) -> None:
        """Attach ``text`` to the calling child's entry in the next report.

        For children that know something worth reporting about how they
        ended, such as a process's exit status. Notes are kept until the
        child ends; they appear in `ChildEnd.notes` if it ends during a
        cancellation. Not a checkpoint.

        Raises:
            RuntimeError: if the calling task is not a child of this bundle.
        """
        self._notes_of_caller("note").notes.append(text)

    def note_abandoned(self, what: str) -> None:
        """Record that the calling child leaves ``what`` running as it ends.

        For children that wrap work Trio cannot cancel, such as a thread: when
        the child is hard-cancelled and has to stop waiting for it, it calls
        this so that the `CancelReport` names what was left behind
        (`ChildEnd.abandoned`). Not a checkpoint.

        Raises:
            RuntimeError: if the calling task is not a child of this bundle.
        """
        self._notes_of_caller("note_abandoned").abandoned.append(what)

    def _notes_of_caller(self, method: str) -> _ChildNotes:
        task = trio.lowlevel.current_task()
        if task not in self:
            raise RuntimeError(
                f"{method}() must be called by a child of bundle "
                f"{self._name!r}, not by {task!r}"
            )
        return self._notes.setdefault(task, _ChildNotes())

    def _outcome(self, exc: BaseException | None) -> ChildOutcome:
        if exc is None:
            hard = self._inner.cancel_scope.cancel_called
            return ChildOutcome.CANCELLED if hard else ChildOutcome.FINISHED
        return ChildOutcome.CANCELLED if is_cancellation(exc) else ChildOutcome.RAISED

    def _child_ended(self, exc: BaseException | None, *, member: bool = True) -> None:
        self._live -= 1
        outcome = self._outcome(exc)
        if outcome is ChildOutcome.RAISED and member:
            # As in a plain nursery, a failing child cancels the body too
            # (the inner nursery already cancels the siblings).
            if self._hard_cancelled_at is None:
                self._hard_cancelled_at = trio.current_time()
                self._trace_hard_cancel(f"a child raised {exc!r}")
            self._outer.cancel_scope.cancel(
                f"child task of bundle {self._name!r} raised {exc!r}"
            )
        task = trio.lowlevel.current_task()
        if outcome is ChildOutcome.CANCELLED and self._inner.cancel_scope.cancel_called:
            # The first child to end after the deadline expired tells the
            # trace, if the waiting caller has not yet.
            self._trace_hard_cancel("the grace period ran out")
        if member and tracing.active:
            emit(
                TraceKind.CHILD_ENDED,
                self._path,
                task_path(task, self._path),
                outcome=outcome,
                detail=repr(exc) if outcome is ChildOutcome.RAISED else None,
            )
        notes = self._notes.pop(task, None)
        cancellation = self._cancellation
        if cancellation is None:
            return
        if member:
            now = trio.current_time()
            cancellation.ended.append(
                ChildEnd(
                    name=task.name,
                    outcome=outcome,
                    ended_at=now,
                    elapsed=now - cancellation.started_at,
                    error=repr(exc) if outcome is ChildOutcome.RAISED else None,
                    abandoned=tuple(notes.abandoned) if notes else (),
                    notes=tuple(notes.notes) if notes else (),
                )
            )
        if self._live == 0 and cancellation.report is None:
            self._finish_cancel(cancellation)

    def _child_ready(self, scope: trio.CancelScope) -> None:
        # From here on the child is under the inner nursery's scope.
        self._start_scopes.discard(scope)
        if tracing.active:
            self._trace_child_started()

    def _trace_child_started(self) -> None:
        task = trio.lowlevel.current_task()
        emit(TraceKind.CHILD_STARTED, self._path, task_path(task, self._path))

    async def _run_child(
        self, async_fn: Callable[..., Awaitable[object]], args: tuple[object, ...]
    ) -> None:
        if tracing.active:
            self._trace_child_started()
        try:
            await async_fn(*args)
        except BaseException as exc:
            self._child_ended(exc)
            raise
        if self._cancellation is None and not self._notes and not tracing.active:
            self._live -= 1  # the common case, kept cheap
        else:
            self._child_ended(None)

    async def _run_starting_child(
        self,
        async_fn: Callable[..., Awaitable[object]],
        args: tuple[object, ...],
        *,
        task_status: trio.TaskStatus[Any],
    ) -> None:
        scope = trio.CancelScope(deadline=self._hard_deadline)
        if self._hard_cancelled_at is not None:
            scope.cancel(f"bundle {self._name!r} was already hard-cancelled")
        status = ForwardingTaskStatus(
            task_status, functools.partial(self._child_ready, scope)
        )
        self._start_scopes.add(scope)
        with scope:
            try:
                await async_fn(*args, task_status=status)
            except BaseException as exc:
                self._start_scopes.discard(scope)
                self._child_ended(exc, member=status.started_called)
                raise
        self._start_scopes.discard(scope)
        self._child_ended(None, member=status.started_called)
        if scope.cancelled_caught and not status.started_called:
            raise RuntimeError(
                f"bundle {self._name!r} was hard-cancelled before "
                f"{trio.lowlevel.current_task().name!r} called task_status.started()"
            )


@final
class _BundleManager:
    """The async context manager returned by `open_bundle`."""

    # Written by hand rather than with @asynccontextmanager, as Trio does for
    # nurseries, to keep tracebacks short and exceptions unwrapped.

    def __init__(self, name: str | None) -> None:
        self._name = name
        self._nursery_manager = trio.open_nursery()
        self._ready = trio.Event()
        self._body_done = trio.Event()
        self._inner: trio.Nursery | None = None
        self._children_error: BaseException | None = None
        self._bundle: Bundle | None = None

    async def _host(self) -> None:
        try:
            async with trio.open_nursery() as inner:
                self._inner = inner
                self._ready.set()
                # Only the end of the body ends the host: a hard cancel of the
                # children must leave the inner nursery open for late starters.
                with trio.CancelScope(shield=True):
                    await self._body_done.wait()
        except BaseException as exc:
            self._children_error = exc
            raise

    @trio.lowlevel.enable_ki_protection
    async def __aenter__(self) -> Bundle:
        outer = await self._nursery_manager.__aenter__()
        task = trio.lowlevel.current_task()
        name = self._name if self._name is not None else f"bundle in {task.name}"
        outer.start_soon(self._host, name=f"<host of bundle {name!r}>")
        # The host only opens a nursery and reports back, so the shield can't
        # hang; it keeps entering a bundle free of cancel points, like a nursery.
        with trio.CancelScope(shield=True):
            await self._ready.wait()
        assert self._inner is not None
        self._bundle = Bundle._create(  # pyright: ignore[reportPrivateUsage]
            name,
            bundle_path(task, name),
            outer,
            self._inner,
            trio.lowlevel.current_trio_token(),
        )
        self._bundle._opened()  # pyright: ignore[reportPrivateUsage]
        return self._bundle

    @trio.lowlevel.enable_ki_protection
    async def __aexit__(
        self,
        etype: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        assert self._bundle is not None
        self._body_done.set()
        try:
            return bool(await self._nursery_manager.__aexit__(etype, exc, tb))
        except BaseException as raised:
            replacement = self._rewrite(raised, exc)
            if replacement is exc:
                return False
            if replacement is raised:
                raise
            old_context = raised.__context__
            try:
                raise replacement
            finally:
                replacement.__context__ = old_context
                del replacement, raised
        finally:
            self._bundle._block_exited()  # pyright: ignore[reportPrivateUsage]
            # The host's exception holds the host's frame, which holds self:
            # drop it, or every bundle that raised would become a cycle.
            self._children_error = None

    def _rewrite(
        self, raised: BaseException, body_exc: BaseException | None
    ) -> BaseException:
        """Give the error leaving the bundle the shape a plain nursery's has.

        The children's exceptions arrive as one group from the host task; they
        are spliced into the outer group. A group holding nothing but
        Cancelled becomes a single Cancelled, so that callers cancelled out
        of a bundle see a plain `trio.Cancelled`.
        """
        outer = as_group(raised)
        if outer is None:
            return raised
        flat = outer
        inner = as_group(self._children_error)
        if inner is not None:
            # The outer cancel scope may have rebuilt the host's group while
            # stripping Cancelled, so recognise it by its leaves, which are
            # never copied.
            inner_leaves = _leaf_ids(inner)
            leaves: list[BaseException] = []
            for e in outer.exceptions:
                group = as_group(e)
                if group is not None and _leaf_ids(group) <= inner_leaves:
                    leaves.extend(group.exceptions)
                else:
                    leaves.append(e)
            flat = outer.derive(leaves)
            flat.__traceback__ = outer.__traceback__
            flat.__cause__ = outer.__cause__
            flat.__suppress_context__ = outer.__suppress_context__
            if hasattr(outer, "__notes__"):
                flat.__notes__ = list(outer.__notes__)
        if is_cancellation(flat):
            if isinstance(body_exc, trio.Cancelled):
                return body_exc
            return first_leaf(flat)
        return flat


def _leaf_ids(group: BaseExceptionGroup[BaseException]) -> set[int]:
    ids: set[int] = set()
    for e in group.exceptions:
        sub = as_group(e)
        ids.update(_leaf_ids(sub) if sub is not None else [id(e)])
    return ids


def open_bundle(*, name: str | None = None) -> _BundleManager:
    """Open a `Bundle`: a nursery whose children can be cancelled gracefully.

    Use it as ``async with trio_graceful.open_bundle() as bundle:``. The body
    starts children with `Bundle.start_soon` / `Bundle.start` and, when it is
    time to stop, calls ``await bundle.cancel(grace)`` (or `Bundle.shutdown`
    to send `STOP` first). Leaving the block waits for the children, exactly
    like a nursery.

    Entering the block is a schedule point but not a cancel point (the
    children's nursery is opened by a helper task); leaving it is a
    checkpoint, as for a nursery.

    Args:
        name (str or None): A name for reports, traces and task names;
            defaults to ``"bundle in <task name>"``.

    Raises:
        TypeError: if ``name`` is not a string or None.
    """
    return _BundleManager(check_name(name))
