"""STOP fan-out: the inboxes and callbacks that one bundle's shutdown reaches.

`Bundle.shutdown` sends STOP once, to every inbox opened with
`Bundle.open_inbox` that still has a receiver and to every callback
registered with `Bundle.on_stop`; whatever registers afterwards gets STOP at
once. This module keeps those registrations and nothing else.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Generator
from typing import Any, TypeVar

import attrs
import trio

from ._inbox import InboxReceiver, InboxSender, InboxState, open_inbox_with_state
from ._log import logger
from ._paths import enclosing_bundle_path, task_path
from ._trace import TraceKind, emit, tracing

T = TypeVar("T")


@attrs.define(eq=False)
class StopFanout:
    """Who gets STOP when a bundle shuts down, and whether it has."""

    # The bundle's path, for the log of a failing callback; given by stop().
    _path: str = ""

    stopping: bool = False
    """True once `stop` has been called."""

    _inboxes: weakref.WeakSet[InboxState[Any]] = attrs.field(
        factory=weakref.WeakSet[InboxState[Any]]
    )
    # {key: (registering task, callback)}
    _callbacks: dict[object, tuple[trio.lowlevel.Task, Callable[[], object]]] = (
        attrs.field(
            factory=dict[object, tuple[trio.lowlevel.Task, Callable[[], object]]]
        )
    )

    @property
    def inboxes(self) -> int:
        """How many inboxes still have a receiver."""
        return len(self._inboxes)

    def open_inbox(
        self, max_buffer_size: int | float, *, stop_first: bool, owner: str
    ) -> tuple[InboxSender[T], InboxReceiver[T]]:
        """Open an inbox that gets STOP when `stop` is called (at once if it was).

        The arguments are those of `Bundle.open_inbox`, and the path of the
        bundle that owns the inbox.
        """
        sender: InboxSender[T]
        receiver: InboxReceiver[T]
        state: InboxState[T]
        sender, receiver, state = open_inbox_with_state(
            max_buffer_size, stop_first=stop_first
        )
        state.owner = owner
        self._inboxes.add(state)
        state.on_receivers_closed = self._inboxes.discard
        if self.stopping:
            state.stop()
        return sender, receiver

    @contextlib.contextmanager
    def on_stop(self, callback: Callable[[], object]) -> Generator[None, None, None]:
        """Call ``callback()`` if `stop` is called while the block runs."""
        task = trio.lowlevel.current_task()
        if self.stopping:
            self._call(task, callback)
            yield
            return
        key = object()
        self._callbacks[key] = (task, callback)
        try:
            yield
        finally:
            del self._callbacks[key]

    def stop(self, path: str) -> None:
        """Send STOP to every inbox and callback, once; ``path`` is the bundle's."""
        if self.stopping:
            return
        self.stopping = True
        self._path = path
        for state in list(self._inboxes):
            state.stop()
        for task, callback in list(self._callbacks.values()):
            self._call(task, callback)

    def _call(self, task: trio.lowlevel.Task, callback: Callable[[], object]) -> None:
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
