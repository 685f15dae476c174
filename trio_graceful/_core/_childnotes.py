"""What a bundle's live children said about themselves, kept until they end.

Notes (`Bundle.note`) and work left running (`Bundle.note_abandoned`). Each
entry goes when its child ends, so that a bundle that serves children for
days keeps only what its live children said.
"""

from __future__ import annotations

import attrs
import trio


@attrs.define(eq=False)
class _Said:
    abandoned: list[str] = attrs.field(factory=list[str])
    notes: list[str] = attrs.field(factory=list[str])


@attrs.define(eq=False)
class ChildNotes:
    """The notes of one bundle's live children."""

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
