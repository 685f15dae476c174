"""Timeline plots of a recorded trace (needs the ``plot`` extra: matplotlib)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import attrs

from ._report import ChildOutcome
from ._trace import Trace, TraceKind

if TYPE_CHECKING:
    from matplotlib.axes import Axes

# One colour per way of ending; a child still running at the end of the trace
# is grey.
_COLOURS = {
    ChildOutcome.FINISHED: "#2e8b57",
    ChildOutcome.CANCELLED: "#d2691e",
    ChildOutcome.RAISED: "#8b008b",
    None: "#9e9e9e",
}


# Vertical lines: colour and style per kind of mark.
_LINES = {
    "cancel": ("#444444", ":"),
    "deadline": ("#e57373", "-."),
    "hard cancel": ("#c62828", "--"),
}


@attrs.define
class _Row:
    path: str
    start: float | None = None
    end: float | None = None
    outcome: ChildOutcome | None = None
    stop_received: list[float] = attrs.field(factory=list[float])


def _rows(trace: Trace) -> list[_Row]:
    rows: dict[str, _Row] = {}
    for event in trace.events:
        if event.task is None:
            continue
        if event.kind is TraceKind.CHILD_STARTED:
            rows.setdefault(event.task, _Row(event.task)).start = event.time
        elif event.kind is TraceKind.CHILD_ENDED:
            row = rows.setdefault(event.task, _Row(event.task))
            row.end, row.outcome = event.time, event.outcome
        elif event.kind is TraceKind.STOP_RECEIVED:
            rows.setdefault(event.task, _Row(event.task)).stop_received.append(
                event.time
            )
    # Tree order: a bundle's children together, under the task that owns it.
    return sorted(rows.values(), key=lambda row: list(map(_order, row.path.split("/"))))


def _order(name: str) -> tuple[str, int]:
    """Sort ``"handler#10"`` after ``"handler#9"`` (see `task_path`)."""
    base, mark, number = name.rpartition("#")
    if mark and number.isdigit():
        return base, int(number)
    return name, 1


# Height of a lane of line labels, in rows.
_LANE = 0.45


def _label_lines(
    draw: Any, lines: list[tuple[float, str, list[str]]], *, below: float
) -> int:
    """Draw the vertical lines and label them under the rows; return the lanes.

    A label that would overlap one before it in its lane moves down a lane.
    """
    canvas = draw.figure.canvas
    renderer = canvas.get_renderer() if hasattr(canvas, "get_renderer") else None
    placed: list[tuple[int, Any]] = []
    for at, what, bundles in lines:
        colour, style = _LINES[what]
        draw.axvline(at, color=colour, linestyle=style, linewidth=1.1)
        outermost = min(bundles, key=lambda path: (path.count("/"), path))
        more = f" (+{len(bundles) - 1} more)" if len(bundles) > 1 else ""
        label = f"{what}: {outermost.rsplit('/', 1)[-1]}{more}"
        lane = 0
        while True:
            text = draw.annotate(
                label,
                xy=(at, below + _LANE * lane),
                xytext=(3, 0),
                textcoords="offset points",
                fontsize=7,
                va="center",
                color=colour,
            )
            if renderer is None:
                break
            box = text.get_window_extent(renderer)
            if not any(lane == other and box.overlaps(b) for other, b in placed):
                placed.append((lane, box))
                break
            text.remove()
            lane += 1
    return max((lane for lane, _ in placed), default=0) + 1


def plot_timeline(
    trace: Trace, *, ax: Axes | None = None, title: str | None = None
) -> Axes:
    """Draw a recorded shutdown as a timeline, one row per task.

    Each child's life is a bar coloured by how it ended (finished, hard-
    cancelled, raised; grey if still running when the recording stopped); a
    black triangle marks when STOP reached it. Vertical lines mark
    cancellations starting (dotted), hard deadlines set by them (dash-dot,
    also when the bundle finished first or an outer hard cancel struck
    first) and hard cancels (dashed red). Each line is labelled with the name
    of the outermost bundle concerned and how many more bundles it concerns.
    Times are seconds since the first event.
    Rows are in the order of the tree of bundles, so nested bundles read as
    indented blocks.

    Args:
        trace (Trace): A recording from `record_trace`.
        ax: A matplotlib ``Axes`` to draw on; a new figure if `None`.
        title (str or None): The plot's title.

    Returns:
        The matplotlib ``Axes`` drawn on.

    Raises:
        ImportError: if matplotlib is not installed (install the ``plot``
            extra: ``pip install "trio-graceful[plot]"``).
        ValueError: if the trace holds no events.
    """
    try:
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise ImportError(
            'plot_timeline needs matplotlib: pip install "trio-graceful[plot]"'
        ) from exc
    if not trace.events:
        raise ValueError("the trace holds no events to plot")

    t0 = trace.events[0].time
    t_end = trace.events[-1].time - t0
    rows = _rows(trace)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 1.2 + 0.35 * max(len(rows), 1)))
    # matplotlib's own annotations are incomplete; draw through an Any.
    draw: Any = ax

    for y, row in enumerate(rows):
        start = 0.0 if row.start is None else row.start - t0
        end = t_end if row.end is None else row.end - t0
        draw.broken_barh(
            [(start, max(end - start, t_end / 400))],
            (y - 0.3, 0.6),
            facecolors=_COLOURS[row.outcome],
        )
        for at in row.stop_received:
            draw.plot(at - t0, y, marker="v", color="black", markersize=7)

    # One line per instant and kind, labelled with the bundles concerned, so
    # that a tree of nested bundles cancelled together stays readable.
    marks: dict[tuple[str, float], list[str]] = {}
    for event in trace.events:
        if event.kind is TraceKind.CANCEL_STARTED:
            marks.setdefault(("cancel", event.time - t0), []).append(event.bundle)
            if event.deadline is not None and event.deadline != math.inf:
                at = event.deadline - t0
                marks.setdefault(("deadline", at), []).append(event.bundle)
        elif event.kind is TraceKind.HARD_CANCEL:
            marks.setdefault(("hard cancel", event.time - t0), []).append(event.bundle)
    hard_cancels = {at for what, at in marks if what == "hard cancel"}
    lines = sorted(
        (at, what, bundles)
        for (what, at), bundles in marks.items()
        # a deadline struck by a hard cancel: the hard cancel line says it
        if what != "deadline" or at not in hard_cancels
    )
    t_end = max([t_end, *(at for at, _, _ in lines)])
    draw.set_xlim(0, t_end * 1.2 if t_end > 0 else 1)
    draw.set_ylim(len(rows) + 0.5, -0.5)
    lanes = _label_lines(draw, lines, below=len(rows))
    # a spare band at the bottom for the labels of the vertical lines
    draw.set_ylim(len(rows) + 0.5 + _LANE * lanes, -0.5)

    # Labels are left-aligned and indented by depth in the tree; the pad makes
    # room for the longest one.
    depth0 = min((row.path.count("/") for row in rows), default=0)
    labels = [
        "  " * (row.path.count("/") - depth0) + row.path.rsplit("/", 1)[-1]
        for row in rows
    ]
    draw.set_yticks(range(len(rows)))
    draw.set_yticklabels(labels, fontsize=8, ha="left", family="monospace")
    draw.tick_params(
        axis="y", pad=5 + 5 * max((len(label) for label in labels), default=0)
    )
    draw.set_xlabel("seconds")
    draw.legend(
        handles=[
            Patch(color=_COLOURS[ChildOutcome.FINISHED], label="finished"),
            Patch(color=_COLOURS[ChildOutcome.CANCELLED], label="hard-cancelled"),
            Patch(color=_COLOURS[ChildOutcome.RAISED], label="raised"),
            Patch(color=_COLOURS[None], label="still running"),
            Line2D(
                [], [], marker="v", color="black", linestyle="", label="STOP received"
            ),
        ],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=7,
    )
    if title is not None:
        draw.set_title(title)
    return ax
