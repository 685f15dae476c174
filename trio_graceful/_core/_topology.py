"""The shape of a bundle: one nursery, each child under a cancel scope of its own.

``async with open_bundle_nursery() as levels: BODY`` opens a plain Trio
nursery: the body runs in the task that opened it, the children in the
nursery, each inside a cancel scope made for it as it starts::

    nursery (levels.nursery.cancel_scope)   <- the body runs here
    ├── child (its own scope)               <- cancel_children() and
    └── child (its own scope)                  set_children_deadline() reach these

so that the children can be hard-cancelled (or given a deadline) without
the body, while everything else is a plain nursery's: cancelling the
nursery's scope cancels body and children, a child that raises cancels its
siblings and the body at once, and the exception group that leaves the block
is the nursery's own. A child that starts after a hard cancel starts
cancelled, and one that starts after a deadline was set gets it.

This module knows nothing of grace periods, STOP or reports: it runs
children, counts them, and tells its owner (if asked) when each starts and ends.
Children started with `BundleNursery.start` keep their scope from their
first step, while they still run under their caller, to their end.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Coroutine
from types import CoroutineType, FunctionType, TracebackType
from typing import TYPE_CHECKING, Any, cast, final

import attrs
import trio

from ._startable import as_coroutine, coroutine_of
from ._util import ForwardingTaskStatus, as_group, first_leaf

if TYPE_CHECKING:
    from typing_extensions import Self


@attrs.frozen
class ChildEvents:
    """What a `BundleNursery` tells its owner about its children, when asked to."""

    started: Callable[[trio.lowlevel.Task], object]
    """A child started with ``start_soon()`` runs for the first time."""

    ready: Callable[[trio.lowlevel.Task], object]
    """A child started with ``start()`` called ``task_status.started()``."""

    ended: Callable[[trio.lowlevel.Task, BaseException | None], object]
    """A child ended, returning (None) or raising this exception."""

    start_failed: Callable[[trio.lowlevel.Task], object]
    """A child ended before it was ready; its error went to its starter."""


def is_cancellation(exc: BaseException) -> bool:
    """True if ``exc`` is `trio.Cancelled`, or a group holding only Cancelled."""
    if isinstance(exc, trio.Cancelled):
        return True
    group = as_group(exc)
    return group is not None and group.split(trio.Cancelled)[1] is None


@final
class BundleNursery:
    """The nursery of one bundle (see the module docstring); `open_bundle_nursery`."""

    __slots__ = (
        "_cancel_reason",
        "_child_scopes",
        "_deadline",
        "_manager",
        "events",
        "live",
        "nursery",
        "owner",
    )

    def __init__(self) -> None:
        self._manager = trio.open_nursery()
        self.nursery: trio.Nursery
        # The scope of every child not ended yet, those still starting included.
        self._child_scopes: set[trio.CancelScope] = set()
        # Set once by cancel_children(): every later child starts cancelled.
        self._cancel_reason: str | None = None
        self._deadline = math.inf
        #: Children started and not ended yet, those still starting included.
        self.live = 0
        #: Told about every child's start and end while set.
        self.events: ChildEvents | None = None
        #: What to call the bundle in error messages.
        self.owner = "the bundle"

    # -- the block ----------------------------------------------------------

    @trio.lowlevel.enable_ki_protection
    async def __aenter__(self) -> Self:
        self.nursery = await self._manager.__aenter__()
        return self

    @trio.lowlevel.enable_ki_protection
    async def __aexit__(
        self,
        etype: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        try:
            return await self._manager.__aexit__(etype, exc, tb)
        except BaseException as raised:
            # A group holding nothing but Cancelled leaves as one Cancelled, so
            # that callers cancelled out of a bundle see a plain trio.Cancelled.
            if as_group(raised) is None or not is_cancellation(raised):
                raise  # kept in no local: its traceback holds this frame
            if isinstance(exc, trio.Cancelled):
                # Let the body's own Cancelled go on as it is: raising it here
                # would add this frame, which holds it, to its traceback.
                return False
            replacement = first_leaf(raised)
            old_context = raised.__context__
            try:
                raise replacement
            finally:
                replacement.__context__ = old_context
                del replacement, raised

    # -- children ----------------------------------------------------------------

    def start_soon(
        self,
        async_fn: Callable[..., Awaitable[object]],
        args: tuple[object, ...],
        name: object,
    ) -> None:
        """Run ``async_fn(*args)`` as a child, under a cancel scope of its own.

        The function is called here, as by `trio.Nursery.start_soon`, so that
        wrong arguments raise in the caller. Not a checkpoint.
        """
        coro: Coroutine[object, object, object]
        if type(async_fn) is FunctionType:  # an async def: the common case
            returned: object = async_fn(*args)
            coro = (
                cast("Coroutine[object, object, object]", returned)
                if type(returned) is CoroutineType
                else as_coroutine(async_fn, returned, "start_soon")
            )
        else:
            coro = coroutine_of(async_fn, args, "start_soon")
        self.nursery.start_soon(self._run_child, coro, self._new_scope(), name=name)
        self.live += 1

    async def start(
        self,
        async_fn: Callable[..., Awaitable[object]],
        args: tuple[object, ...],
        name: object,
    ) -> Any:
        """Start a child with `trio.Nursery.start`. This is a checkpoint."""
        self.live += 1
        return await self.nursery.start(
            self._run_starting_child, async_fn, args, name=name
        )

    @property
    def children_cancel_called(self) -> bool:
        """Whether the children have been hard-cancelled (or their deadline passed)."""
        return self._cancel_reason is not None or trio.current_time() >= self._deadline

    def set_children_deadline(self, deadline: float) -> None:
        """Give every child, those started later included, the hard ``deadline``."""
        self._deadline = deadline
        for scope in self._child_scopes:
            scope.deadline = deadline

    def cancel_children(self, reason: str) -> None:
        """Hard-cancel every child, and those started later, but not the body."""
        if self._cancel_reason is None:
            self._cancel_reason = reason
        for scope in self._child_scopes:
            scope.cancel(reason)

    def _new_scope(self) -> trio.CancelScope:
        scope = trio.CancelScope(deadline=self._deadline)
        if self._cancel_reason is not None:
            scope.cancel(self._cancel_reason)
        self._child_scopes.add(scope)
        return scope

    def _child_ended(
        self,
        task: trio.lowlevel.Task,
        scope: trio.CancelScope,
        exc: BaseException | None,
    ) -> None:
        # Called inside the child's scope, so that its owner can tell a child
        # that returned while hard-cancelled by the child's effective deadline.
        self._child_scopes.discard(scope)
        self.live -= 1
        if exc is not None and not is_cancellation(exc):
            # The nursery will cancel the body once the error reaches it; do it
            # now, before anything this end wakes (a cancel() waiting for the
            # last child, say) can run as if all were well.
            self.nursery.cancel_scope.cancel(f"a child task raised {exc!r}")
        if self.events is not None:
            self.events.ended(task, exc)

    async def _run_child(
        self, coro: Coroutine[object, object, object], scope: trio.CancelScope
    ) -> None:
        task = trio.lowlevel.current_task()
        if self.events is not None:
            self.events.started(task)
        with scope:
            try:
                await coro
            except BaseException as exc:
                self._child_ended(task, scope, exc)
                raise
            self._child_ended(task, scope, None)

    async def _run_starting_child(
        self,
        async_fn: Callable[..., Awaitable[object]],
        args: tuple[object, ...],
        *,
        task_status: trio.TaskStatus[Any],
    ) -> None:
        task = trio.lowlevel.current_task()
        scope = self._new_scope()
        # started() may be called from another task (an asyncio loop's, say):
        # the child is this task, whoever reports it ready.
        status = ForwardingTaskStatus(task_status, lambda: self._child_ready(task))
        with scope:
            try:
                await async_fn(*args, task_status=status)
            except BaseException as exc:
                self._starting_child_ended(task, scope, status, exc)
                raise
            self._starting_child_ended(task, scope, status, None)
        if not status.started_called and scope.cancelled_caught:
            raise RuntimeError(
                f"{self.owner} was hard-cancelled before {task.name!r} "
                f"called task_status.started()"
            )

    def _starting_child_ended(
        self,
        task: trio.lowlevel.Task,
        scope: trio.CancelScope,
        status: ForwardingTaskStatus,
        exc: BaseException | None,
    ) -> None:
        if status.started_called:
            self._child_ended(task, scope, exc)
            return
        # It was never ours: its error, if any, goes to its starter.
        self._child_scopes.discard(scope)
        self.live -= 1
        if self.events is not None:
            self.events.start_failed(task)

    def _child_ready(self, task: trio.lowlevel.Task) -> None:
        if self.events is not None:
            self.events.ready(task)


def open_bundle_nursery() -> BundleNursery:
    """Return the async context manager of a new `BundleNursery`.

    Entering is not a checkpoint; leaving is one, as for a nursery.
    """
    return BundleNursery()
