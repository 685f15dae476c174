"""Drawing recorded trace events as a timeline (needs matplotlib, the plot extra)."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

from .._core._jsonform import check_type
from .._core._report import ChildOutcome
from .._core._trace import TraceEvent, TraceKind
from ._timeline import place_labels, rows

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

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

# Line labels are monospaced, so their widths are known before drawing:
# DejaVu Sans Mono advances 0.602 em per character.
LABEL_SIZE = 7.0
CHAR_WIDTH = 0.62 * LABEL_SIZE  # points
LANE_HEIGHT = 1.6 * LABEL_SIZE  # points
GAP = 3.0  # points
MARGIN = 0.1  # inches of white around what a figure of ours holds

_NEEDS_MATPLOTLIB = (
    'plotting a timeline needs matplotlib: pip install "trio-graceful[plot]"'
)


def vertical_lines(
    events: Sequence[TraceEvent], t0: float
) -> list[tuple[float, str, str]]:
    """Return ``(time, kind of line, label)`` for each vertical line, in time order.

    One line per instant and kind, labelled with the outermost bundle
    concerned and how many more, so that a tree of nested bundles cancelled
    together stays readable.
    """
    marks: dict[tuple[str, float], list[str]] = {}
    for event in events:
        if event.kind is TraceKind.CANCEL_STARTED:
            marks.setdefault(("cancel", event.time - t0), []).append(event.bundle)
            if event.deadline is not None and event.deadline != math.inf:
                at = event.deadline - t0
                marks.setdefault(("deadline", at), []).append(event.bundle)
        elif event.kind is TraceKind.HARD_CANCEL:
            marks.setdefault(("hard cancel", event.time - t0), []).append(event.bundle)
    hard_cancels = {at for what, at in marks if what == "hard cancel"}
    lines: list[tuple[float, str, str]] = []
    for (what, at), bundles in marks.items():
        if what == "deadline" and at in hard_cancels:
            continue  # a deadline struck by a hard cancel: that line says it
        outermost = min(bundles, key=lambda path: (path.count("/"), path))
        more = f" (+{len(bundles) - 1} more)" if len(bundles) > 1 else ""
        lines.append((at, what, f"{what}: {outermost.rsplit('/', 1)[-1]}{more}"))
    return sorted(lines)


def draw_timeline(
    events: Sequence[TraceEvent], *, ax: Axes | None, title: str | None
) -> Axes:
    """Draw ``events`` (not empty) as a timeline; see `Trace.plot`.

    Without ``ax``, on a new pyplot figure (shown by Jupyter and
    ``plt.show()``), sized to hold everything drawn.
    """
    try:
        import matplotlib.pyplot as plt
        from matplotlib.axes import Axes
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise ImportError(_NEEDS_MATPLOTLIB) from exc
    check_type("ax", ax, (Axes, type(None)), "a matplotlib Axes or None")
    if ax is not None:
        _draw(events, ax, title=title, created=False)
        return ax
    _, ax = plt.subplots(figsize=_first_size(events))
    _draw(events, ax, title=title, created=True)
    return ax


def timeline_figure(events: Sequence[TraceEvent], *, title: str | None) -> Figure:
    """Draw ``events`` (not empty) on a new figure that pyplot does not keep.

    Nothing needs closing, and no GUI backend is involved; the figure is
    sized to hold everything drawn.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise ImportError(_NEEDS_MATPLOTLIB) from exc
    figure = Figure(figsize=_first_size(events))
    _draw(events, figure.subplots(), title=title, created=True)
    return figure


def save_figure(
    figure: Figure,
    file: str | os.PathLike[str] | IO[bytes],
    *,
    dpi: float,
    format: str | None,
) -> None:
    """Save ``figure``, through an Any: matplotlib leaves savefig's keywords untyped."""
    draw: Any = figure
    draw.savefig(file, dpi=dpi, format=format)


def _first_size(events: Sequence[TraceEvent]) -> tuple[float, float]:
    """Width and height in inches of a new figure, before it is fitted."""
    return (10, 1.2 + 0.35 * max(len(rows(events)), 1))


def _fit(figure: Any, ax: Any) -> None:
    """Size ``figure`` to what it holds, plus `MARGIN`, keeping the axes' size.

    The labels above the axes were placed from the axes' width in points;
    the axes keep their size in inches, so the placement still holds. Once
    fitted, a plain ``savefig`` cuts off nothing (the title, the lanes of
    labels, the legend on the right, the row names, the x label).
    """
    width, height = figure.get_size_inches()
    position = ax.get_position()
    with warnings.catch_warnings():
        # measuring draws the text: a glyph missing from the font is for
        # matplotlib to warn about when the figure is shown or saved, once
        warnings.simplefilter("ignore", UserWarning)
        holds = figure.get_tightbbox()  # inches, with a renderer of its canvas
    figure.set_size_inches(holds.width + 2 * MARGIN, holds.height + 2 * MARGIN)
    new_width, new_height = figure.get_size_inches()
    ax.set_position(
        (
            (position.x0 * width - holds.x0 + MARGIN) / new_width,
            (position.y0 * height - holds.y0 + MARGIN) / new_height,
            position.width * width / new_width,
            position.height * height / new_height,
        )
    )


def _draw(
    events: Sequence[TraceEvent], ax: Axes, *, title: str | None, created: bool
) -> None:
    """Draw the timeline on ``ax``; if its figure is ours, fit the figure to it."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    t0 = events[0].time
    t_end = events[-1].time - t0
    timeline = rows(events)
    # matplotlib's own annotations are incomplete; draw through an Any.
    draw: Any = ax

    for y, row in enumerate(timeline):
        start = 0.0 if row.start is None else row.start - t0
        end = t_end if row.end is None else row.end - t0
        draw.broken_barh(
            [(start, max(end - start, t_end / 400))],
            (y - 0.3, 0.6),
            facecolors=_COLOURS[row.outcome],
        )
        for at in row.stop_received:
            draw.plot(at - t0, y, marker="v", color="black", markersize=7)

    lines = vertical_lines(events, t0)
    t_end = max([t_end, *(at for at, _, _ in lines)])
    x_max = t_end * 1.2 if t_end > 0 else 1
    draw.set_xlim(0, x_max)
    draw.set_ylim(max(len(timeline), 1) - 0.5, -0.5)
    lanes = _label_lines(draw, lines, x_max=x_max)
    if created:
        # room above the axes for the lanes of line labels
        width, height = draw.figure.get_size_inches()
        draw.figure.set_size_inches(width, height + lanes * LANE_HEIGHT / 72)

    # Labels are left-aligned and indented by depth in the tree; the pad makes
    # room for the longest one.
    depth0 = min((row.depth for row in timeline), default=0)
    labels = ["  " * (row.depth - depth0) + row.name for row in timeline]
    draw.set_yticks(range(len(timeline)))
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
        draw.set_title(title, pad=6 + lanes * LANE_HEIGHT)
    if created:
        _fit(draw.figure, draw)


def _label_lines(
    draw: Any, lines: list[tuple[float, str, str]], *, x_max: float
) -> int:
    """Draw the vertical lines, label them above the axes; return the lanes used.

    Positions are worked out in points from the axes' size, before anything
    is drawn (see `place_labels`), so no two labels overlap at any dpi.
    """
    figure_width = draw.figure.get_size_inches()[0] * 72
    width = figure_width * draw.get_position().width
    placed = place_labels(
        [(at / x_max * width, CHAR_WIDTH * len(label)) for at, _, label in lines],
        limit=width,
        gap=GAP,
    )
    for (at, what, label), place in zip(lines, placed, strict=True):
        colour, style = _LINES[what]
        draw.axvline(at, color=colour, linestyle=style, linewidth=1.1)
        draw.annotate(
            label,
            xy=(at, 1.0),
            xycoords=draw.get_xaxis_transform(),
            xytext=(
                GAP if place.align == "left" else -GAP,
                (place.lane + 0.5) * LANE_HEIGHT,
            ),
            textcoords="offset points",
            fontsize=LABEL_SIZE,
            family="monospace",
            ha=place.align,
            va="center",
            color=colour,
            annotation_clip=False,
        )
    return max((place.lane for place in placed), default=-1) + 1
