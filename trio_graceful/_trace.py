"""Trace events: what bundles and inboxes do, for hooks and recordings.

Every bundle and inbox reports what it does (a child started or ended, STOP
sent or received, a cancellation started, a hard cancel, a cancellation
finished) as a `TraceEvent`, stamped with Trio's clock and with the path of
the task in the tree of bundles (``root/connections/handler``). Nothing is
built unless a hook is installed in the current Trio run: the hot paths only
read one module-level counter.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import attrs
import trio

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from ._report import ChildOutcome

logger = logging.getLogger("trio_graceful")


class TraceKind(enum.Enum):
    """What a `TraceEvent` records."""

    BUNDLE_OPENED = "bundle opened"
    BUNDLE_CLOSED = "bundle closed"
    CHILD_STARTED = "child started"
    CHILD_ENDED = "child ended"
    STOP_SENT = "STOP sent"
    STOP_RECEIVED = "STOP received"
    CANCEL_STARTED = "cancel started"
    HARD_CANCEL = "hard cancel"
    CANCEL_FINISHED = "cancel finished"
    STATE_CHANGED = "state changed"


@attrs.frozen
class TraceEvent:
    """One thing a bundle or an inbox did."""

    kind: TraceKind
    """What happened."""

    time: float
    """When, in Trio time (`trio.current_time`: monotonic, virtual under a
    mock clock)."""

    bundle: str
    """The path of the bundle concerned, like ``"root/connections"``; for an
    inbox event, the nearest bundle around the task (``""`` if none); ``""``
    for `TraceKind.STATE_CHANGED`."""

    task: str | None = None
    """The path of the task concerned (``"root/connections/handler"``):
    the child for child events, the receiver for STOP received, the caller
    for STOP sent and cancel started; `None` when no task is concerned.
    Children of one bundle that share a name are numbered in the order they
    first ran: ``handler``, ``handler#2``, ``handler#3``..."""

    grace: float | None = None
    """For `TraceKind.CANCEL_STARTED`, the grace asked for."""

    deadline: float | None = None
    """For `TraceKind.CANCEL_STARTED` and `TraceKind.HARD_CANCEL`, the hard
    deadline in Trio time."""

    outcome: ChildOutcome | None = None
    """For `TraceKind.CHILD_ENDED`, how the child ended."""

    detail: str | None = None
    """A human-readable detail, such as the error of a raising child, why a
    hard cancel happened, the summary of a finished cancellation, or for
    `TraceKind.STATE_CHANGED` the program's transition, like
    ``"svc: ready -> shutting down (SIGTERM)"``."""


TraceHook = Callable[[TraceEvent], object]

_hooks: trio.lowlevel.RunVar[list[TraceHook]] = trio.lowlevel.RunVar(
    "trio_graceful hooks"
)


@attrs.define
class _HookCount:
    active: int = 0


# Hooks installed in all runs together; zero means "emit nothing", which the
# hot paths check (``if tracing.active:``) without touching the RunVar.
tracing = _HookCount()


def _run_hooks() -> list[TraceHook]:
    try:
        return _hooks.get()
    except LookupError:
        hooks: list[TraceHook] = []
        _hooks.set(hooks)
        return hooks


def add_trace_hook(hook: TraceHook) -> None:
    """Call ``hook(event)`` for every `TraceEvent` in the current Trio run.

    Hooks are called synchronously from the task where the event happens and
    must not block. A hook that raises is removed, and its error is logged to
    the ``trio_graceful`` logger. Not a checkpoint.

    Raises:
        RuntimeError: if called outside a Trio run.
    """
    _run_hooks().append(hook)
    tracing.active += 1


def remove_trace_hook(hook: TraceHook) -> None:
    """Stop calling ``hook``. Not a checkpoint.

    Raises:
        KeyError: if ``hook`` is not installed in the current run.
        RuntimeError: if called outside a Trio run.
    """
    hooks = _run_hooks()
    if hook not in hooks:
        raise KeyError(f"trace hook {hook!r} is not installed in this run")
    hooks.remove(hook)
    tracing.active -= 1


def emit(
    kind: TraceKind,
    bundle: str,
    task: str | None = None,
    *,
    grace: float | None = None,
    deadline: float | None = None,
    outcome: ChildOutcome | None = None,
    detail: str | None = None,
) -> None:
    """Deliver an event to the hooks of the current run.

    Callers check ``tracing.active`` first, so that nothing is built when
    nobody listens anywhere.
    """
    hooks = _run_hooks()
    if not hooks:
        return
    event = TraceEvent(
        kind,
        trio.current_time(),
        bundle,
        task,
        grace=grace,
        deadline=deadline,
        outcome=outcome,
        detail=detail,
    )
    for hook in list(hooks):
        try:
            hook(event)
        except Exception:
            logger.exception("trace hook %r raised; it has been removed", hook)
            remove_trace_hook(hook)


@attrs.define
class Trace:
    """The events recorded by `record_trace`, in the order they happened."""

    events: list[TraceEvent] = attrs.field(factory=list[TraceEvent])
    """Every event recorded."""

    def tasks(self) -> list[str]:
        """Return the paths of the tasks seen, in order of first appearance."""
        seen: dict[str, None] = {}
        for event in self.events:
            if event.task is not None:
                seen.setdefault(event.task, None)
        return list(seen)

    def of_kind(self, kind: TraceKind) -> list[TraceEvent]:
        """Return the events of one kind."""
        return [e for e in self.events if e.kind is kind]

    def of_task(self, task: str) -> list[TraceEvent]:
        """Return the events about one task path."""
        return [e for e in self.events if e.task == task]

    def plot(self, *, ax: Axes | None = None, title: str | None = None) -> Axes:
        """Draw the trace as a timeline; see `plot_timeline`."""
        from ._plot import plot_timeline

        return plot_timeline(self, ax=ax, title=title)


@contextmanager
def record_trace() -> Generator[Trace, None, None]:
    """Record the trace events of the current Trio run while the block runs.

    Use it around a shutdown to explain it afterwards::

        with trio_graceful.record_trace() as trace:
            await bundle.shutdown(grace=10)
        for event in trace.events:
            print(event.time, event.kind.value, event.task)

    Not a checkpoint. Raises `RuntimeError` outside a Trio run.
    """
    trace = Trace()
    add_trace_hook(trace.events.append)
    try:
        yield trace
    finally:
        remove_trace_hook(trace.events.append)
