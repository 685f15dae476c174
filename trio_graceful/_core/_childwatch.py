"""What a bundle hears of its children as they start and end.

The nurseries (``_topology``) tell their owner of each child's start, of
its readiness under `Bundle.start` and of its end, but only while someone
listens: a trace hook, a cancellation, or a child that left a note. A
`ChildWatch` is that listener for one bundle: it traces the starts and the
ends, tells how each child ended (`outcome_of`) and hands the end to the
bundle's cancellation (``_cancellation``), which records it. It keeps what
the live children said about themselves (`ChildNotes`: notes, and work left
running) and the names their paths use (`TaskNames`), each forgotten as its
child ends, so that a bundle that serves children for days keeps only what
its live children said. Once a path has been asked for here, every child is
named as it starts, so that live namesakes never share a path.
"""

from __future__ import annotations

import math
from typing import final

import attrs
import trio

from ._cancellation import CancelDriver
from ._groups import is_cancellation
from ._paths import Place, TaskNames, task_path
from ._report import ChildOutcome
from ._topology import BundleNurseries, ChildEvents
from ._trace import TraceKind, emit, tracing


def outcome_of(exc: BaseException | None, nurseries: BundleNurseries) -> ChildOutcome:
    """How the calling child of ``nurseries`` ended, returning or raising ``exc``.

    A child that returned while a hard cancel of it was in effect swallowed
    the `trio.Cancelled` it was given: it counts as hard-cancelled.
    """
    if exc is not None:
        return ChildOutcome.CANCELLED if is_cancellation(exc) else ChildOutcome.RAISED
    # Walking the cancel scopes is the costly part: only when one was cancelled.
    if (
        nurseries.children_cancel_called or nurseries.outer.cancel_scope.cancel_called
    ) and trio.current_effective_deadline() == -math.inf:
        return ChildOutcome.CANCELLED
    return ChildOutcome.FINISHED


@attrs.define(eq=False)
class _Said:
    abandoned: list[str] = attrs.field(factory=list[str])
    notes: list[str] = attrs.field(factory=list[str])


@attrs.define(eq=False)
class ChildNotes:
    """What one bundle's live children said: `Bundle.note`, `Bundle.note_abandoned`."""

    _said: dict[trio.lowlevel.Task, _Said] = attrs.field(
        factory=dict["trio.lowlevel.Task", _Said]
    )

    def note(self, task: trio.lowlevel.Task, text: str) -> None:
        """Record ``text`` for the report entry of ``task``."""
        self._said.setdefault(task, _Said()).notes.append(text)

    def note_abandoned(self, task: trio.lowlevel.Task, what: str) -> None:
        """Record that ``task`` leaves ``what`` running as it ends."""
        self._said.setdefault(task, _Said()).abandoned.append(what)

    def forget(
        self, task: trio.lowlevel.Task
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Drop what ``task``, which has ended, said; return (abandoned, notes)."""
        said = self._said.pop(task, None)
        if said is None:
            return (), ()
        return tuple(said.abandoned), tuple(said.notes)


@final
class ChildWatch:
    """The listener of one bundle's children (see the module docstring).

    Args:
        bundle: The bundle, for the paths of the trace events.
        nurseries: Its nurseries, which tell how a child ended.
    """

    __slots__ = (
        "_bundle",
        "_cancellation",
        "_names",
        "_notes",
        "_nurseries",
    )

    def __init__(self, bundle: Place, nurseries: BundleNurseries) -> None:
        self._bundle = bundle
        self._nurseries = nurseries
        self._notes: ChildNotes | None = None
        # The names of the children in paths, from the first path asked for.
        self._names: TaskNames | None = None
        # Told of each end once the bundle is cancelling (follow()).
        self._cancellation: CancelDriver | None = None

    def follow(self, cancellation: CancelDriver) -> None:
        """Hand each end to ``cancellation`` from now on. Not a checkpoint.

        A child's end is on the path of every shutdown: the cancellation is
        kept here, so that no call is added to it.
        """
        self._cancellation = cancellation

    def events(self) -> ChildEvents:
        """The callbacks to give the nurseries."""
        return ChildEvents(
            self._started, self._started, self._ended, self._start_failed
        )

    def notes(self) -> ChildNotes:
        """The notes of the live children, kept from now on."""
        if self._notes is None:
            self._notes = ChildNotes()
        return self._notes

    def name(self, task: trio.lowlevel.Task) -> str:
        """Return the name of ``task`` in paths, the same for as long as it lives.

        The first call names the children already running, in the order they
        started; from then on each child is named as it starts.
        """
        names = self._names
        if names is None:
            names = self._names = TaskNames.of_running(self._nurseries.children)
        return names.name(task, child=self._nurseries.is_child(task))

    def _started(self, task: trio.lowlevel.Task) -> None:
        """Name and trace a child as it first runs, or as it reports itself ready."""
        if self._names is not None:
            self._names.name(task)
        if tracing.active:
            bundle = self._bundle
            emit(TraceKind.CHILD_STARTED, bundle.path, task_path(task, bundle))

    def _ended(self, task: trio.lowlevel.Task, exc: BaseException | None) -> None:
        """Record and trace a child's end."""
        cancellation = self._cancellation
        if cancellation is None and not tracing.active:
            self._forget(task)
            return
        outcome = outcome_of(exc, self._nurseries)
        if tracing.active:
            bundle = self._bundle
            emit(
                TraceKind.CHILD_ENDED,
                bundle.path,
                task_path(task, bundle),
                outcome=outcome,
                detail=repr(exc) if outcome is ChildOutcome.RAISED else None,
            )
        abandoned, notes = self._forget(task)
        if cancellation is not None:
            cancellation.child_ended(task, exc, outcome, abandoned, notes)

    def _start_failed(self, task: trio.lowlevel.Task) -> None:
        """Forget a child that ended before it was ready: it was never ours."""
        self._forget(task)
        if self._cancellation is not None:
            self._cancellation.finish_if_done()

    def _forget(
        self, task: trio.lowlevel.Task
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        # (abandoned, notes) of the child that ended
        if self._names is not None:
            self._names.release(task)
        return ((), ()) if self._notes is None else self._notes.forget(task)
