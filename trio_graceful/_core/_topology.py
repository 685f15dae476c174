"""The shape of a bundle: a body and its children in two nurseries, errors as one.

``async with open_two_level() as levels: BODY`` builds::

    outer nursery (levels.outer.cancel_scope)   <- the body runs here
    └── host task
        └── inner nursery (levels.children_scope) <- every child runs here

so that the children can be cancelled (or given a deadline) without the
body, while everything else behaves like one plain nursery: cancelling the
outer scope cancels body and children, a child that raises cancels its
siblings and the body at once, and the exception group that leaves the block
has the shape, and the order, that a plain nursery's would have.

With ``one_level=True`` there is no host: the children run in the outer
nursery beside the body, so that cancelling them cancels the body too. That
is for an owner whose body only waits and does its own work after the block.

This module knows nothing of grace periods, STOP or reports: it runs
children, counts them, and tells its owner (if asked) when each starts and ends.
Children started with `TwoLevelNursery.start` are still under their caller
until they call ``task_status.started()``; each gets a cancel scope of its
own meanwhile, so that `TwoLevelNursery.cancel_children` and
`TwoLevelNursery.set_children_deadline` reach them too.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Coroutine
from types import CoroutineType, FunctionType, TracebackType
from typing import TYPE_CHECKING, Any, cast, final

import attrs
import trio

from ._groups import as_group, first_leaf, is_cancellation
from ._lowlevel import ForwardingTaskStatus, forbid_abort
from ._startable import as_coroutine, coroutine_of

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

if TYPE_CHECKING:
    from typing_extensions import Self


@attrs.frozen
class ChildEvents:
    """What a `TwoLevelNursery` tells its owner about its children, when asked to."""

    started: Callable[[trio.lowlevel.Task], object]
    """A child started with ``start_soon()`` runs for the first time."""

    ready: Callable[[trio.lowlevel.Task], object]
    """A child started with ``start()`` called ``task_status.started()``."""

    ended: Callable[[trio.lowlevel.Task, BaseException | None], object]
    """A child ended, returning (None) or raising this exception."""

    start_failed: Callable[[trio.lowlevel.Task], object]
    """A child ended before it was ready; its error went to its starter."""


@final
class TwoLevelNursery:
    """The nurseries of one bundle; see the module docstring. Use `open_two_level`."""

    __slots__ = (
        "_body_ended",
        "_children_error",
        "_early_errors",
        "_host",
        "_manager",
        "_one_level",
        "_opener",
        "_start_scopes",
        "events",
        "inner",
        "live",
        "outer",
        "owner",
    )

    def __init__(self, *, one_level: bool = False) -> None:
        self._one_level = one_level
        self._manager = trio.open_nursery()
        self.outer: trio.Nursery
        self.inner: trio.Nursery
        self._opener: trio.lowlevel.Task | None = None
        self._host: trio.lowlevel.Task | None = None
        self._body_ended = False
        # What the host task raised: the children's group, spliced into the
        # outer group by __aexit__.
        self._children_error: BaseException | None = None
        # Errors of children that failed while the body still ran: a plain
        # nursery lists them before the body's own error.
        self._early_errors: list[BaseException] = []
        # Cancel scopes of children still starting under start().
        self._start_scopes: set[trio.CancelScope] = set()
        #: Children started and not ended yet, those still starting included.
        self.live = 0
        #: Told about every child's start and end while set.
        self.events: ChildEvents | None = None
        #: What to call these nurseries in error messages.
        self.owner = "the bundle"

    # -- the block ----------------------------------------------------------

    @trio.lowlevel.enable_ki_protection
    async def __aenter__(self) -> Self:
        self.outer = await self._manager.__aenter__()
        if self._one_level:
            self.inner = self.outer
            return self
        self._opener = trio.lowlevel.current_task()
        self.outer.start_soon(self._run_host, name=f"<host of {self.owner}>")
        # Entering must not be a cancel point, as for a nursery: wait for the
        # host (it only opens a nursery) where nothing but it can wake us.
        await trio.lowlevel.wait_task_rescheduled(forbid_abort)
        return self

    async def _run_host(self) -> None:
        try:
            async with trio.open_nursery() as inner:
                self.inner = inner
                self._host = trio.lowlevel.current_task()
                assert self._opener is not None
                trio.lowlevel.reschedule(self._opener)
                # Only the end of the body ends the host: a hard cancel of the
                # children leaves their nursery open for late starters.
                await trio.lowlevel.wait_task_rescheduled(forbid_abort)
        except BaseException as exc:
            self._children_error = exc
            raise

    @trio.lowlevel.enable_ki_protection
    async def __aexit__(
        self,
        etype: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._body_ended = True
        if self._host is not None:
            trio.lowlevel.reschedule(self._host)
            self._host = None
        try:
            return await self._manager.__aexit__(etype, exc, tb)
        except BaseException as raised:
            replacement = self._rewrite(raised, exc)
            if replacement is exc:
                # Let the body's own exception go on as it is: raising it here
                # would add this frame, which holds it, to its traceback.
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
            # The host's exception holds the host's frame, which holds self:
            # drop it, or every bundle that raised would become a cycle.
            self._children_error = None
            self._early_errors.clear()

    # -- children ----------------------------------------------------------------

    def start_soon(
        self,
        async_fn: Callable[..., Awaitable[object]],
        args: tuple[object, ...],
        name: object,
    ) -> None:
        """Run ``async_fn(*args)`` as a child in the inner nursery.

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
        self.inner.start_soon(self._run_child, coro, name=name)
        self.live += 1

    async def start(
        self,
        async_fn: Callable[..., Awaitable[object]],
        args: tuple[object, ...],
        name: object,
    ) -> Any:
        """Start a child with `trio.Nursery.start`. This is a checkpoint.

        Until it is ready, the child is under a cancel scope of its own.
        """
        self.live += 1
        return await self.inner.start(
            self._run_starting_child, async_fn, args, name=name
        )

    @property
    def children(self) -> frozenset[trio.lowlevel.Task]:
        """The children running now, as `trio.Nursery.child_tasks`."""
        return self.inner.child_tasks

    def is_child(self, task: trio.lowlevel.Task) -> bool:
        """Whether ``task`` is a child, or is starting to be one under `start`."""
        inner = self.inner
        return task.parent_nursery is inner or task.eventual_parent_nursery is inner

    @property
    def children_cancel_called(self) -> bool:
        """Whether the children's scope has been cancelled (or its deadline passed)."""
        return self.inner.cancel_scope.cancel_called

    def set_children_deadline(self, deadline: float) -> None:
        """Give every child, starting ones included, the hard ``deadline``."""
        self.inner.cancel_scope.deadline = deadline
        for scope in self._start_scopes:
            scope.deadline = deadline

    def cancel_children(self, reason: str) -> None:
        """Hard-cancel every child, starting ones included, but not the body."""
        self.inner.cancel_scope.cancel(reason)
        for scope in self._start_scopes:
            scope.cancel(reason)

    def _child_failed(self, exc: BaseException) -> None:
        # As in a plain nursery, a failing child cancels the body too (the
        # inner nursery already cancels the siblings).
        if not self._body_ended:
            self._early_errors.append(exc)
        self.outer.cancel_scope.cancel(f"a child task raised {exc!r}")

    async def _run_child(self, coro: Coroutine[object, object, object]) -> None:
        if self.events is not None:
            self.events.started(trio.lowlevel.current_task())
        try:
            await coro
        except BaseException as exc:
            self.live -= 1
            if not is_cancellation(exc):
                self._child_failed(exc)
            if self.events is not None:
                self.events.ended(trio.lowlevel.current_task(), exc)
            raise
        self.live -= 1
        if self.events is not None:
            self.events.ended(trio.lowlevel.current_task(), None)

    async def _run_starting_child(
        self,
        async_fn: Callable[..., Awaitable[object]],
        args: tuple[object, ...],
        *,
        task_status: trio.TaskStatus[Any],
    ) -> None:
        task = trio.lowlevel.current_task()
        scope = trio.CancelScope(deadline=self.inner.cancel_scope.deadline)
        if self.inner.cancel_scope.cancel_called:
            scope.cancel(f"{self.owner} was already hard-cancelled")
        # started() may be called from another task (an asyncio loop's, say):
        # the child is this task, whoever reports it ready.
        status = ForwardingTaskStatus(
            task_status, lambda: self._child_ready(task, scope)
        )
        self._start_scopes.add(scope)
        try:
            with scope:
                await async_fn(*args, task_status=status)
        except BaseException as exc:
            self._start_scopes.discard(scope)
            self.live -= 1
            if status.started_called:
                if not is_cancellation(exc):
                    self._child_failed(exc)
                if self.events is not None:
                    self.events.ended(task, exc)
            elif self.events is not None:
                self.events.start_failed(task)
            raise
        self._start_scopes.discard(scope)
        self.live -= 1
        if status.started_called:
            if self.events is not None:
                self.events.ended(task, None)
            return
        if self.events is not None:
            self.events.start_failed(task)
        if scope.cancelled_caught:
            raise RuntimeError(
                f"{self.owner} was hard-cancelled before {task.name!r} "
                f"called task_status.started()"
            )

    def _child_ready(self, task: trio.lowlevel.Task, scope: trio.CancelScope) -> None:
        # From here on the child is under the inner nursery's scope.
        self._start_scopes.discard(scope)
        if self.events is not None:
            self.events.ready(task)

    # -- the error that leaves the block -----------------------------------------

    def _rewrite(
        self, raised: BaseException, body_exc: BaseException | None
    ) -> BaseException:
        """Give the error leaving the block the shape a plain nursery's has.

        The children's exceptions arrive as one group from the host task;
        they are spliced into the outer group, in the order a plain nursery
        would have collected them (children that failed while the body ran,
        the body's error, the rest). A group holding nothing but Cancelled
        becomes a single Cancelled, so that callers cancelled out of a
        bundle see a plain `trio.Cancelled`.
        """
        outer = as_group(raised)
        if outer is None:
            return raised
        flat = outer
        inner = as_group(self._children_error)
        if inner is not None:
            flat = self._splice(outer, inner, body_exc)
        if is_cancellation(flat):
            if isinstance(body_exc, trio.Cancelled):
                return body_exc
            return first_leaf(flat)
        return flat

    def _splice(
        self,
        outer: BaseExceptionGroup[BaseException],
        inner: BaseExceptionGroup[BaseException],
        body_exc: BaseException | None,
    ) -> BaseExceptionGroup[BaseException]:
        # The outer cancel scope may have rebuilt the host's group while
        # stripping Cancelled, so recognise it by its leaves, never copied.
        inner_leaves = _leaf_ids(inner)
        early = {id(e) for e in self._early_errors}
        before: list[BaseException] = []
        after: list[BaseException] = []
        for e in outer.exceptions:
            group = as_group(e)
            if group is not None and _leaf_ids(group) <= inner_leaves:
                for child_exc in group.exceptions:
                    (before if id(child_exc) in early else after).append(child_exc)
            elif e is body_exc:
                after.insert(0, e)  # the body's error, before later children's
            else:
                after.append(e)
        leaves = before + after
        flat = outer.derive(leaves)
        flat.__traceback__ = outer.__traceback__
        flat.__cause__ = outer.__cause__
        flat.__suppress_context__ = outer.__suppress_context__
        if hasattr(outer, "__notes__"):
            flat.__notes__ = list(outer.__notes__)
        return flat


def _leaf_ids(group: BaseExceptionGroup[BaseException]) -> set[int]:
    ids: set[int] = set()
    for e in group.exceptions:
        sub = as_group(e)
        ids.update(_leaf_ids(sub) if sub is not None else [id(e)])
    return ids


def open_two_level(*, one_level: bool = False) -> TwoLevelNursery:
    """Return the async context manager of a new `TwoLevelNursery`.

    Entering is a schedule point but not a cancel point (not even a schedule
    point with ``one_level``); leaving is a checkpoint, as for a nursery.
    """
    return TwoLevelNursery(one_level=one_level)
