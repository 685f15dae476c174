"""The rows of a timeline: one per task, named after what the user named.

Plots and exports show the same rows, so they are derived here, from the
events alone. A row is named after the last part of its task path. Trio names
a task after its function (``myapp.server.handle_client``); the row keeps the
function's own name (``handle_client``). A private function
(``trio._highlevel_serve_listeners._run_handler``) is a library's wrapper
around what the user passed, not something the user named: such a row is
named after the bundle it runs in and its number there (``connections #2``).

A path names one live task, but a later task may have it again once the first
has ended (a connection's requests, one after another, all ``GET /work``).
Each life is a row of its own: the second is ``GET /work (2)``, numbered in
the order the lives started within the trace.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from .._core._report import ChildOutcome
from .._core._trace import TraceEvent, TraceKind


@attrs.define
class Row:
    """One task's line on a timeline."""

    path: str
    bundle: str = ""
    start: float | None = None
    end: float | None = None
    outcome: ChildOutcome | None = None
    stop_received: list[float] = attrs.field(factory=list[float])
    life: int = 1
    """Which task of this path the row is, in the order they started."""

    @property
    def name(self) -> str:
        """What to call the row; see the module's docstring."""
        name = row_name(self.path, self.bundle)
        return name if self.life == 1 else f"{name} ({self.life})"

    @property
    def depth(self) -> int:
        """How deep the task is in the tree of bundles."""
        if _own_name(self.path, self.bundle) is not None:
            return self.bundle.count("/") + 1
        return self.path.count("/")


def _own_name(path: str, bundle: str) -> str | None:
    """The part of ``path`` after its bundle's path, which may hold ``/`` too."""
    if bundle and path.startswith(bundle + "/"):
        return path[len(bundle) + 1 :]
    return None


def row_name(path: str, bundle: str) -> str:
    """Name the row of the task at ``path``, a child of the bundle ``bundle``.

    A task's own name may hold a ``/`` (a request named ``GET /work``, say):
    with its bundle known, the name is what follows the bundle's path.
    """
    own = _own_name(path, bundle)
    base, number = _split_number(path.rsplit("/", 1)[-1] if own is None else own)
    parts = base.split(".")
    if len(parts) > 1 and all(p.isidentifier() or p == "<locals>" for p in parts):
        base = parts[-1]  # a function's qualified name
    if base.startswith("_") and bundle:
        return f"{bundle.rsplit('/', 1)[-1]} #{number}"
    return base if number == 1 else f"{base}#{number}"


def _split_number(name: str) -> tuple[str, int]:
    """``"handler#10"`` -> ``("handler", 10)`` (see `task_path`)."""
    base, mark, number = name.rpartition("#")
    if mark and number.isdigit():
        return base, int(number)
    return name, 1


def rows(events: Iterable[TraceEvent]) -> list[Row]:
    """Return one row per task that started, ended or got STOP, in tree order.

    A bundle's children stay together, under the task that owns the bundle,
    and namesakes are in number order (``handler#9`` before ``handler#10``).
    """
    found: list[Row] = []
    # The row of each path's latest task.
    latest: dict[str, Row] = {}
    for event in events:
        task = event.task
        if task is None:
            continue
        row = latest.get(task)
        if event.kind is TraceKind.CHILD_STARTED:
            if row is None or row.end is not None:
                row = _new_row(found, latest, task, row)
            row.start, row.bundle = event.time, event.bundle
        elif event.kind is TraceKind.CHILD_ENDED:
            if row is None or row.end is not None:
                row = _new_row(found, latest, task, row)
            row.end, row.outcome, row.bundle = event.time, event.outcome, event.bundle
        elif event.kind is TraceKind.STOP_RECEIVED:
            if row is None:
                row = _new_row(found, latest, task, row)
            row.stop_received.append(event.time)
    return sorted(
        found,
        key=lambda row: (list(map(_split_number, row.path.split("/"))), row.life),
    )


def _new_row(
    found: list[Row], latest: dict[str, Row], path: str, previous: Row | None
) -> Row:
    row = latest[path] = Row(path, life=1 if previous is None else previous.life + 1)
    found.append(row)
    return row


@attrs.frozen
class Placed:
    """Where a label goes: its lane (0 nearest the rows) and its extent."""

    lane: int
    left: float
    right: float
    align: str
    """``"left"`` if the label starts at its line, ``"right"`` if it ends there."""


def place_labels(
    anchors: Sequence[tuple[float, float]], *, limit: float, gap: float
) -> list[Placed]:
    """Give each label a lane so that no two labels in a lane overlap.

    ``anchors`` are ``(x, width)`` pairs, in one unit (points), sorted by
    ``x``. A label starts ``gap`` right of its ``x``, or ends ``gap`` left of
    it when it would run past ``limit``. It takes the first lane where it
    keeps ``gap`` away from every label already there.
    """
    placed: list[Placed] = []
    ends: list[list[tuple[float, float]]] = []  # per lane: the extents taken
    for x, width in anchors:
        left, align = x + gap, "left"
        if left + width > limit and x - gap - width >= 0:
            left, align = x - gap - width, "right"
        right = left + width
        lane = 0
        while lane < len(ends) and any(
            left < end + gap and begin < right + gap for begin, end in ends[lane]
        ):
            lane += 1
        if lane == len(ends):
            ends.append([])
        ends[lane].append((left, right))
        placed.append(Placed(lane, left, right, align))
    return placed
