"""Trace events: what bundles and inboxes do, delivered to hooks.

Every bundle and inbox reports what it does (a child started or ended, STOP
sent or received, a cancellation started, a hard cancel, a cancellation
finished) as a `TraceEvent`, stamped with Trio's clock and with the path of
the task in the tree of bundles (``root/connections/handler``). Nothing is
built unless a hook is installed in the current Trio run: the hot paths only
read one module-level counter. Keeping events (`Trace`), drawing and
exporting them are layers above, in ``_recording``, ``_plot`` and
``_chrome``.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

from ._jsonform import (
    check_mapping,
    enum_from_json,
    float_from_json,
    float_to_json,
    optional_float_from_json,
    str_from_json,
    wall,
)
from ._log import logger
from ._report import ChildOutcome


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
    """When, in Trio time (`trio.current_time`, which is monotonic, and
    virtual under a mock clock)."""

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

    def as_dict(self, *, wall_clock_offset: float | None = None) -> dict[str, Any]:
        """Return the event as a dictionary of JSON values.

        The kind and outcome are their string values. ``time_wall`` (and
        ``deadline_wall``) is the wall-clock time, seconds since the epoch,
        of ``time + wall_clock_offset``; `None` without an offset (see
        `Trace.wall_clock_offset`). An infinite grace or deadline is
        written ``"inf"``. Not a checkpoint.
        """
        return {
            "kind": self.kind.value,
            "time": self.time,
            "time_wall": wall(self.time, wall_clock_offset),
            "bundle": self.bundle,
            "task": self.task,
            "grace": None if self.grace is None else float_to_json(self.grace),
            "deadline": None if self.deadline is None else float_to_json(self.deadline),
            "deadline_wall": wall(self.deadline, wall_clock_offset),
            "outcome": None if self.outcome is None else self.outcome.value,
            "detail": self.detail,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TraceEvent:
        """Rebuild an event from `as_dict`'s output.

        Wall-clock times are derived, so they are not read back.

        Raises:
            TypeError: if ``data`` is not a mapping.
            ValueError: if a field is missing or holds the wrong kind of value.
        """
        data = check_mapping(data, "data")
        outcome = data.get("outcome")
        return cls(
            kind=enum_from_json(TraceKind, data, "kind"),
            time=float_from_json(data, "time"),
            bundle=str_from_json(data, "bundle", optional=False) or "",
            task=str_from_json(data, "task", optional=True),
            grace=optional_float_from_json(data, "grace"),
            deadline=optional_float_from_json(data, "deadline"),
            outcome=(
                None
                if outcome is None
                else enum_from_json(ChildOutcome, data, "outcome")
            ),
            detail=str_from_json(data, "detail", optional=True),
        )


TraceHook = Callable[[TraceEvent], object]

_on_first_hook: trio.lowlevel.RunVar[Callable[[], object]] = trio.lowlevel.RunVar(
    "trio_graceful first hook"
)


@attrs.define
class _HookCount:
    """The hooks installed in all live runs together: zero means "emit nothing".

    The hot paths check ``if tracing.active:`` without touching a RunVar;
    the hooks themselves are per run, and a run that ends takes its own out
    of the count (`_RunHooks.after_run`). Runs in other threads change the
    count too, hence the lock.
    """

    active: int = 0
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def change(self, by: int) -> None:
        with self._lock:
            self.active += by


tracing = _HookCount()


@attrs.define(eq=False)
class _RunHooks(trio.abc.Instrument):
    """The hooks of one run; an instrument of the run from its first hook on."""

    hooks: list[TraceHook] = attrs.field(factory=list[TraceHook])

    def after_run(self) -> None:
        """Take the hooks still installed out of the count as the run ends.

        Otherwise a run that never removed its hooks would keep every later
        run of the process on the traced paths.
        """
        tracing.change(-len(self.hooks))
        self.hooks.clear()


_hooks: trio.lowlevel.RunVar[_RunHooks] = trio.lowlevel.RunVar("trio_graceful hooks")


def _run_hooks() -> list[TraceHook]:
    # the hooks of the current run; none if it never had one
    try:
        return _hooks.get().hooks
    except LookupError:
        return []


def add_trace_hook(hook: TraceHook) -> None:
    """Call ``hook(event)`` for every `~trio_graceful.TraceEvent` of the current run.

    That includes the end of every child already running when the hook is
    added, however its bundle ends.

    Hooks are called synchronously from the task where the event happens and
    must not block. A hook that raises is removed, and its error is logged to
    the ``trio_graceful`` logger. Not a checkpoint.

    Raises:
        TypeError: if ``hook`` is not callable.
        RuntimeError: if called outside a Trio run.
    """
    _check_hook(hook)
    try:
        hooks = _hooks.get().hooks
    except LookupError:
        run_hooks = _RunHooks()
        trio.lowlevel.add_instrument(run_hooks)
        _hooks.set(run_hooks)
        hooks = run_hooks.hooks
    first = not hooks
    hooks.append(hook)
    tracing.change(+1)
    if first:
        try:
            begin = _on_first_hook.get()
        except LookupError:
            return
        begin()


def on_first_hook(callback: Callable[[], object]) -> None:
    """Call ``callback()`` each time the current run goes from no hook to one.

    The bundles listen to their children only while a hook might want to hear
    of them; this tells them to listen to the children already running, so
    that a hook added late still sees every end. One callback per run.
    """
    _on_first_hook.set(callback)


def _check_hook(hook: object) -> None:
    if not callable(hook):
        raise TypeError(f"hook must be a callable taking a TraceEvent, not {hook!r}")


def remove_trace_hook(hook: TraceHook) -> None:
    """Stop calling ``hook``. Not a checkpoint.

    Raises:
        TypeError: if ``hook`` is not callable.
        KeyError: if ``hook`` is not installed in the current run.
        RuntimeError: if called outside a Trio run.
    """
    _check_hook(hook)
    hooks = _run_hooks()
    if hook not in hooks:
        raise KeyError(f"trace hook {hook!r} is not installed in this run")
    hooks.remove(hook)
    tracing.change(-1)


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
