"""Bundles: nurseries whose children can be cancelled with a grace period.

A `Bundle` is the policy on top of three mechanisms, each in its own module:
the two-nursery shape that lets the children be cancelled without the body
(`_topology`), the record of one cancellation (`_cancellation`), and the
fan-out of STOP to inboxes and callbacks (`_stopfanout`). What the bundle
itself owns is its phase, from one transition table::

    OPEN ──cancel()──▶ CANCELLING ──last child ended──▶ CLOSED
      └────────────────block exited─────────────────────▶

and what ties the pieces together: which child's end is recorded where,
what is traced, and the checks on its callers.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, cast, final

import attrs
import trio

from ._callerchecks import check_child_says, check_waiter
from ._cancellation import Cancellation
from ._checks import check_seconds
from ._childwatch import ChildWatch
from ._inbox import InboxReceiver, InboxSender
from ._lowlevel import NoPublicConstructor
from ._paths import Place, bundle_path, register, task_path, unregister
from ._phase import BundlePhase, PhaseRecord
from ._report import BundleStatistics, CancelReport
from ._startable import check_startable
from ._stopfanout import StopFanout
from ._topology import TwoLevelNursery
from ._trace import TraceKind, emit, tracing

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from typing_extensions import Never, TypeVar, TypeVarTuple, Unpack

    PosArgT = TypeVarTuple("PosArgT")
    # An inbox's message type, when its variables name none: STOP only.
    MessageT = TypeVar("MessageT", default=Never)

#: The grace of `Bundle.cancel` and `Bundle.shutdown` when none is given.
DEFAULT_GRACE: Final = 10.0


@final
@attrs.define(eq=False, repr=False)
class Bundle(metaclass=NoPublicConstructor):
    """A nursery whose children can be cancelled gracefully. See `open_bundle`.

    A bundle can stand in for a `trio.Nursery`: it has `start_soon`, `start`,
    `cancel_scope`, `child_tasks` and `parent_task`, so it can be passed as
    ``handler_nursery`` to `trio.serve_tcp`, `trio.serve_listeners` or
    trio-websocket's ``serve_websocket``. Those functions annotate the
    argument as `trio.Nursery`, a class nothing else can be, so pass
    ``handler_nursery=bundle.as_nursery()``: the same bundle, typed as a
    nursery (see `as_nursery`). Its own operations are `cancel`, `shutdown`,
    `open_inbox`, `on_stop` and `statistics`.
    """

    _name: str
    _levels: TwoLevelNursery
    _token: trio.lowlevel.TrioToken
    # The bundle around the one that opened this, when it opened.
    _parent: Place | None
    _phase: PhaseRecord
    _path: str | None = None
    # Created by the first cancel() call.
    _cancellation: Cancellation | None = None
    # Created when the first inbox, callback or shutdown needs it.
    _fanout: StopFanout | None = None
    # Listens to the children's starts and ends; created when needed.
    _watch: ChildWatch | None = None

    def __repr__(self) -> str:
        return (
            f"<trio_graceful.Bundle {self._name!r} {self._phase.phase.value}, "
            f"{self._levels.live} children at {id(self):#x}>"
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
        if self._path is None:
            self._path = bundle_path(self.parent_task, self._name, self._parent)
        return self._path

    @property
    def cancel_scope(self) -> trio.CancelScope:
        """The scope around the body and the children, as `trio.Nursery.cancel_scope`.

        Cancelling it hard-cancels everything at once, body included.
        """
        return self._levels.outer.cancel_scope

    @property
    def child_tasks(self) -> frozenset[trio.lowlevel.Task]:
        """The children still running, as `trio.Nursery.child_tasks`."""
        return self._levels.children

    @property
    def parent_task(self) -> trio.lowlevel.Task:
        """The task that opened the bundle, as `trio.Nursery.parent_task`."""
        return self._levels.outer.parent_task

    def as_nursery(self) -> trio.Nursery:
        """Return this bundle, typed as a `trio.Nursery` for type checkers.

        For the ``handler_nursery`` argument of `trio.serve_tcp`,
        `trio.serve_listeners` and trio-websocket's ``serve_websocket``, which
        are annotated `trio.Nursery`, a class only Trio can create::

            await trio.serve_tcp(handler, port, handler_nursery=bundle.as_nursery())

        Nothing is wrapped or converted: the result *is* the bundle (``bundle
        .as_nursery() is bundle``), so its children are the bundle's children
        and `cancel` and `shutdown` reach them. Only the nursery surface
        (`start_soon`, `start`, `cancel_scope`, `child_tasks`, `parent_task`)
        exists on it. Not a checkpoint.

        Returns:
            trio.Nursery: This bundle.
        """
        return cast("trio.Nursery", self)

    def start_soon(
        self,
        async_fn: Callable[[Unpack[PosArgT]], Awaitable[object]],
        *args: Unpack[PosArgT],
        name: object = None,
    ) -> None:
        """Start ``await async_fn(*args)`` as a child, like `trio.Nursery.start_soon`.

        ``async_fn(*args)`` is called here, so that wrong arguments raise in
        the caller, as with a nursery. A child started while the bundle is
        cancelling gets the same hard deadline and is waited for by `cancel`.
        Not a checkpoint.

        Args:
            async_fn: An async function.
            *args: Positional arguments for ``async_fn``.
            name: The task's name, as in `trio.Nursery.start_soon`.

        Raises:
            RuntimeError: if the bundle is closed: `cancel` has finished, or
                the ``async with`` block has exited and every child has ended.
            TypeError: if ``async_fn`` is not an async function, or does not
                take these arguments.
        """
        if self._phase.phase is BundlePhase.CLOSED:
            self._phase.check_open()
        if tracing.active:
            self.watch_children()
        self._levels.start_soon(async_fn, args, async_fn if name is None else name)

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
            TypeError: if ``async_fn`` is not an async function (a coroutine
                object passed instead is closed).
        """
        self._phase.check_open()
        check_startable(async_fn)
        if tracing.active:
            self.watch_children()
        return await self._levels.start(
            async_fn, args, async_fn if name is None else name
        )

    # -- graceful cancellation ------------------------------------------------

    @property
    def hard_deadline(self) -> float:
        """The children's hard deadline in Trio time; `math.inf` if not cancelling.

        The earliest ``now + grace`` asked of `cancel` so far.
        """
        cancellation = self._cancellation
        return math.inf if cancellation is None else cancellation.deadline

    @property
    def cancelling(self) -> bool:
        """True once `cancel` (or `shutdown`) has been called."""
        return self._cancellation is not None

    @property
    def closed(self) -> bool:
        """True once the bundle accepts no new children."""
        return self._phase.phase is BundlePhase.CLOSED

    async def cancel(self, grace: float = DEFAULT_GRACE) -> CancelReport:
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
            grace (float): Seconds to wait before the hard cancel, 10 by
                default; 0 hard-cancels at once, `math.inf` waits as long as
                it takes.

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

    async def shutdown(self, grace: float = DEFAULT_GRACE) -> CancelReport:
        """Send `STOP` to every inbox of this bundle, then `cancel` with ``grace``.

        The inboxes opened with `open_inbox` get STOP behind the messages
        already queued, and the callbacks registered with `on_stop` are
        called; an inbox opened (or a callback registered) after this call
        gets STOP at once. This is a checkpoint; see `cancel` for the rest.

        Args:
            grace (float): As for `cancel`: 10 seconds by default.

        Returns:
            CancelReport: As for `cancel`.

        Raises:
            TypeError, ValueError, RuntimeError: As for `cancel`.
        """
        grace = check_seconds("grace", grace)
        self._check_caller("shutdown")
        self._stop_fanout().stop(self.path)
        return await self._cancel(grace)

    def on_stop(
        self, callback: Callable[[], object]
    ) -> contextlib.AbstractContextManager[None]:
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

        Raises:
            TypeError: if ``callback`` is not callable.
            RuntimeError: if the bundle is closed: no shutdown can begin any
                more, so the callback could never be called.
        """
        if not callable(callback):
            raise TypeError(f"callback must be callable, not {callback!r}")
        self._phase.check_open("a callback registered now could never be called")
        return self._stop_fanout().on_stop(callback)

    def __contains__(self, task: object) -> bool:
        """``task in bundle``: is ``task`` a child of this bundle?

        Children still starting under `start` count too. Like ``task in
        bundle.child_tasks`` without copying the set. Not a checkpoint.
        """
        return isinstance(task, trio.lowlevel.Task) and self._levels.is_child(task)

    def open_inbox(
        self, max_buffer_size: int | float = 0, *, stop_first: bool = False
    ) -> tuple[InboxSender[MessageT], InboxReceiver[MessageT]]:
        """Open an inbox that `shutdown` will stop. Not a checkpoint.

        Give the receiver to a child; `shutdown` queues `STOP` on it behind
        the messages already sent. Declare the two variables to give the
        message type (``tx: InboxSender[Job]``, ``rx: InboxReceiver[Job]``);
        without them it is `typing.Never`: STOP only, nothing can be sent.

        Args:
            max_buffer_size (int or math.inf): As for `open_inbox`.
            stop_first (bool): As for `open_inbox`: STOP goes ahead of the
                queued messages, which `InboxReceiver.drain_nowait` hands back.

        Raises:
            TypeError, ValueError: for a bad ``max_buffer_size``.
            RuntimeError: if the bundle is closed: no shutdown can begin any
                more, so the inbox would never get STOP.
        """
        self._phase.check_open("an inbox opened now would never get STOP")
        return self._stop_fanout().open_inbox(
            max_buffer_size, stop_first=stop_first, owner=self.path
        )

    def statistics(self) -> BundleStatistics:
        """Return a `BundleStatistics` snapshot. Not a checkpoint."""
        return BundleStatistics(
            children_running=self._levels.live,
            cancelling=self._phase.phase is BundlePhase.CANCELLING,
            closed=self._phase.phase is BundlePhase.CLOSED,
            hard_deadline=self.hard_deadline,
            inboxes=0 if self._fanout is None else self._fanout.inboxes,
        )

    # -- notes from children ------------------------------------------------------

    def note(self, text: str) -> None:
        """Attach ``text`` to the calling child's entry in the next report.

        For children that know something worth reporting about how they
        ended, such as a process's exit status. Notes are kept until the
        child ends; they appear in `ChildEnd.notes` if it ends during a
        cancellation. Not a checkpoint.

        Raises:
            TypeError: if ``text`` is not a string.
            RuntimeError: if the calling task is not a child of this bundle.
        """
        task = trio.lowlevel.current_task()
        check_child_says("note", "text", text, self._name, task in self)
        self.watch_children().notes().note(task, text)

    def note_abandoned(self, what: str) -> None:
        """Record that the calling child leaves ``what`` running as it ends.

        For children that wrap work Trio cannot cancel, such as a thread: when
        the child is hard-cancelled and has to stop waiting for it, it calls
        this so that the `CancelReport` names what was left behind
        (`ChildEnd.abandoned`). Not a checkpoint.

        Raises:
            TypeError: if ``what`` is not a string.
            RuntimeError: if the calling task is not a child of this bundle.
        """
        task = trio.lowlevel.current_task()
        check_child_says("note_abandoned", "what", what, self._name, task in self)
        self.watch_children().notes().note_abandoned(task, what)

    def child_name(self, task: trio.lowlevel.Task) -> str:
        """Return the name ``task`` goes by in paths (a `Place` of ``_paths``)."""
        return self.watch_children().name(task)

    def watch_children(self) -> ChildWatch:
        """Listen to the children from now on (a `Place` of ``_paths``)."""
        watch = self._watch
        if watch is None:
            watch = self._watch = ChildWatch(
                self, self._levels, on_finished=self._cancel_finished
            )
        if self._levels.events is None:
            self._levels.events = watch.events()
        return watch

    # -- internals --------------------------------------------------------------

    def _check_caller(self, method: str) -> None:
        check_waiter(
            method, self._name, self._token, self._levels.inner, self.parent_task
        )

    async def _cancel(self, grace: float) -> CancelReport:
        now = trio.current_time()
        cancellation = self._cancellation
        if cancellation is None:
            cancellation = self._cancellation = Cancellation(
                self._levels, self._name, self.path, started_at=now
            )
            if self._phase.phase is BundlePhase.OPEN:
                self._phase.move_to(BundlePhase.CANCELLING)
            self.watch_children().follow(cancellation)
        cancellation.move_deadline(now + grace)
        if tracing.active:
            emit(
                TraceKind.CANCEL_STARTED,
                self.path,
                task_path(trio.lowlevel.current_task()),
                grace=grace,
                deadline=cancellation.deadline,
            )
        if cancellation.finish_if_done():
            self._cancel_finished()
        return await cancellation.wait()

    def _cancel_finished(self) -> None:
        self._phase.close("cancel() has finished")

    def _opened(self) -> None:
        register(self, self.parent_task, self._levels.inner)
        if tracing.active:
            emit(TraceKind.BUNDLE_OPENED, self.path)

    def _stop_fanout(self) -> StopFanout:
        if self._fanout is None:
            self._fanout = StopFanout()  # given the path only if it is needed
        return self._fanout

    def _block_exited(self) -> None:
        # Every child has ended: nothing more to watch (and no cycle to keep).
        self._levels.events = None
        self._watch = None
        self._phase.close("its block has exited")
        unregister(self, self.parent_task, self._levels.inner)
        if tracing.active:
            emit(TraceKind.BUNDLE_CLOSED, self.path)
