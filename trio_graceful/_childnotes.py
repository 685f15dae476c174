"""What a bundle's live children said about themselves, kept until they end.

Notes (`Bundle.note`), work left running (`Bundle.note_abandoned`) and the
names their paths use in traces (`TaskNames`). Each entry goes when its
child ends, so that a bundle that serves children for days keeps only what
its live children said.
"""

from __future__ import annotations

import attrs
import trio

from ._paths import TaskNames


@attrs.define(eq=False)
class _Said:
    abandoned: list[str] = attrs.field(factory=list[str])
    notes: list[str] = attrs.field(factory=list[str])


@attrs.define(eq=False)
class ChildNotes:
    """The notes and names of one bundle's live children."""

    _said: dict[trio.lowlevel.Task, _Said] = attrs.field(
        factory=dict["trio.lowlevel.Task", _Said]
    )
    _names: TaskNames = attrs.field(factory=TaskNames)

    def note(self, task: trio.lowlevel.Task, text: str) -> None:
        """Record ``text`` for the report entry of ``task``."""
        self._said.setdefault(task, _Said()).notes.append(text)

    def note_abandoned(self, task: trio.lowlevel.Task, what: str) -> None:
        """Record that ``task`` leaves ``what`` running as it ends."""
        self._said.setdefault(task, _Said()).abandoned.append(what)

    def name(self, task: trio.lowlevel.Task) -> str:
        """Return the name of ``task`` among its live namesakes."""
        return self._names.take(task)

    def forget(
        self, task: trio.lowlevel.Task
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Drop what ``task``, which has ended, said; return (abandoned, notes)."""
        if self._names:
            self._names.release(task)
        said = self._said.pop(task, None)
        if said is None:
            return (), ()
        return tuple(said.abandoned), tuple(said.notes)
