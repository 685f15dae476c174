"""Sphinx extension: the lifecycle's state diagram, drawn from its transition table.

``.. lifecycle-diagram::`` renders
`trio_graceful._run._program._lifecycle.TRANSITIONS` as an inline SVG in HTML
(and as a list of transitions in other formats), so the picture cannot drift
from the code. The layout needs no Graphviz: states sit in a row, ordered by
the longest path from the initial state (cycles cut); transitions between
neighbours are straight arrows, longer forward ones arc above the row,
backward ones arc below, and self-transitions loop on top.
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING, Any

from trio_graceful._run._program._lifecycle import (
    INITIAL_STATE,
    TRANSITIONS,
    LifecycleState,
)

if TYPE_CHECKING:
    from sphinx.application import Sphinx

BOX_WIDTH = 112
BOX_HEIGHT = 36
GAP = 96
ARC_STEP = 40
MARGIN = 12


def columns() -> dict[LifecycleState, int]:
    """Each state's column: its longest distance from the initial state.

    Edges that close a cycle (back to a state already on the path) are cut,
    which leaves a DAG whose longest paths give a left-to-right order.
    """
    column = {INITIAL_STATE: 0}
    forward: set[tuple[LifecycleState, LifecycleState]] = set()

    def visit(state: LifecycleState, path: tuple[LifecycleState, ...]) -> None:
        for (source, _), target in TRANSITIONS.items():
            if source is state and target not in path:
                forward.add((source, target))
                visit(target, (*path, target))

    visit(INITIAL_STATE, (INITIAL_STATE,))
    changed = True
    while changed:
        changed = False
        for source, target in forward:
            if source in column and column.get(target, -1) < column[source] + 1:
                column[target] = column[source] + 1
                changed = True
    return column


def render_svg() -> str:
    column = columns()
    states = sorted(column, key=column.__getitem__)
    span = max(column.values()) + 1
    longest = max(
        (abs(column[t] - column[s]) for (s, _), t in TRANSITIONS.items()), default=1
    )
    top = MARGIN + 16 + ARC_STEP * longest * 0.75
    width = 2 * MARGIN + span * BOX_WIDTH + (span - 1) * GAP
    height = top + BOX_HEIGHT + ARC_STEP * 2 + MARGIN + 16

    def left(state: LifecycleState) -> float:
        return MARGIN + column[state] * (BOX_WIDTH + GAP)

    def centre(state: LifecycleState) -> float:
        return left(state) + BOX_WIDTH / 2

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="100%" '
        f'style="max-width: {width}px" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="lifecycle state diagram" font-family="sans-serif" '
        f'font-size="12">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" '
        'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z"/></marker></defs>',
    ]
    for (source, event), target in TRANSITIONS.items():
        label = escape(event.value)
        distance = column[target] - column[source]
        if source is target:
            x = centre(source)
            path = (
                f"M{x - 14},{top} C{x - 30},{top - 34} {x + 30},{top - 34} "
                f"{x + 14},{top}"
            )
            label_at = (x, top - 32)
        elif distance == 1:
            y = top + BOX_HEIGHT / 2
            x1, x2 = left(source) + BOX_WIDTH, left(target)
            path = f"M{x1},{y} L{x2},{y}"
            label_at = ((x1 + x2) / 2, y - 6)
        elif distance > 1:
            # Arcs of different lengths end apart on the target.
            x1, x2 = centre(source) + 10, centre(target) - 10 * distance
            peak = top - ARC_STEP * distance
            path = f"M{x1},{top} C{x1},{peak} {x2},{peak} {x2},{top}"
            label_at = ((x1 + x2) / 2, top - ARC_STEP * distance * 0.75 - 4)
        else:
            bottom = top + BOX_HEIGHT
            x1, x2 = centre(source) - 10, centre(target) + 10
            dip = bottom + ARC_STEP * 2
            path = f"M{x1},{bottom} C{x1},{dip} {x2},{dip} {x2},{bottom}"
            label_at = ((x1 + x2) / 2, bottom + ARC_STEP * 1.5 + 12)
        parts.append(
            f'<path d="{path}" fill="none" stroke="#444" marker-end="url(#arrow)"/>'
        )
        x, y = label_at
        parts.append(
            f'<text x="{x:.0f}" y="{y:.0f}" text-anchor="middle" '
            f'fill="#333">{label}</text>'
        )
    for state in states:
        fill = "#eef" if state is INITIAL_STATE else "#fff"
        parts.append(
            f'<rect x="{left(state)}" y="{top}" width="{BOX_WIDTH}" '
            f'height="{BOX_HEIGHT}" rx="8" fill="{fill}" stroke="#222"/>'
            f'<text x="{centre(state)}" y="{top + BOX_HEIGHT / 2 + 4}" '
            f'text-anchor="middle" font-weight="bold">{escape(state.value)}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def render_text() -> str:
    return "\n".join(
        f"{source.value} --{event.value}--> {target.value}"
        for (source, event), target in TRANSITIONS.items()
    )


def setup(app: Sphinx) -> dict[str, Any]:
    # Sphinx is imported here only, so that the tests can check the
    # rendering without it.
    from docutils import nodes
    from sphinx import addnodes
    from sphinx.util.docutils import SphinxDirective

    class LifecycleDiagram(SphinxDirective):
        """``.. lifecycle-diagram::``: the diagram, or a text list off HTML."""

        has_content = False

        def run(self) -> list[nodes.Node]:
            html = addnodes.only(expr="html")
            html += nodes.raw("", render_svg(), format="html")
            other = addnodes.only(expr="not html")
            text = render_text()
            other += nodes.literal_block(text, text)
            return [html, other]

    app.add_directive("lifecycle-diagram", LifecycleDiagram)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
