"""The README explains every row of the demo's table."""

from __future__ import annotations

from pathlib import Path

from tests.support.examples import load_example

ROOT = Path(__file__).resolve().parent.parent.parent


def explained(readme: str) -> list[str]:
    """The rows that the list under ``<!-- demo-rows -->`` names, in order."""
    rows = readme.split("<!-- demo-rows -->\n", 1)[1].split("\n\n", 1)[0]
    return [
        line.split("`", 2)[1] for line in rows.splitlines() if line.startswith("- `")
    ]


def test_the_readme_explains_each_row_of_the_demo_in_order():
    # Each item names its row by the row's label, or the label's start
    # (``refused`` for ``refused: got {"error": ...}, may retry elsewhere``).
    demo = load_example("websocket_demo")
    rows = [row.strip() for row in demo.ROWS] + ["graceful server's log"]
    named = explained((ROOT / "README.md").read_text())
    assert len(named) == len(rows), named
    pairs = zip(rows, named, strict=True)
    assert [row for row, name in pairs if not row.startswith(name)] == []


def test_a_row_left_out_is_found():
    readme = "<!-- demo-rows -->\n- `requests sent`: all\n- `answered`: yes\n\nEnd"
    assert explained(readme) == ["requests sent", "answered"]
