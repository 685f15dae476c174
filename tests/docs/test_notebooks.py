"""The teaching notebooks run top to bottom in a real Jupyter kernel.

They use Trio's mock clock, so they print the same text every time: the
text outputs committed with them must be exactly what a fresh run prints.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

DOCS = Path(__file__).parent.parent.parent / "docs"
NOTEBOOKS = sorted((DOCS / "notebooks").glob("*.ipynb"))


def text_outputs(notebook: nbformat.NotebookNode) -> list[dict[str, str]]:
    """Each code cell's text, per stream, joined.

    The kernel may split one write into several stream outputs (or merge
    several), depending on timing, so only the joined text is compared.
    """
    cells: list[dict[str, str]] = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        text: dict[str, str] = {}
        for output in cell.outputs:
            if output.output_type == "stream":
                key = output.name
                value = output.text
            elif output.output_type == "execute_result":
                key = "result"
                value = output.get("data", {}).get("text/plain", "")
            else:
                continue
            text[key] = text.get(key, "") + value
        cells.append(text)
    return cells


def test_every_notebook_is_in_the_docs():
    index = (DOCS / "notebooks.rst").read_text()
    assert NOTEBOOKS
    for path in NOTEBOOKS:
        assert f"notebooks/{path.stem}" in index


@pytest.mark.realtime
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_matches_its_outputs(path: Path):
    committed = nbformat.read(path, as_version=4)
    fresh = nbformat.read(path, as_version=4)
    NotebookClient(
        fresh,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    ).execute()
    errors = [
        output
        for cell in fresh.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "error"
    ]
    assert errors == []
    assert text_outputs(fresh) == text_outputs(committed)
    # every plot cell drew a figure
    for cell in fresh.cells:
        if cell.cell_type == "code" and ".plot(" in cell.source:
            assert any("image/png" in o.get("data", {}) for o in cell.outputs)
