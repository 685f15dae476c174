"""The teaching notebooks run top to bottom in a real Jupyter kernel.

They use Trio's mock clock, so they print the same text every time: the
text outputs committed with them must be exactly what a fresh run prints.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

DOCS = Path(__file__).parent.parent / "docs"
NOTEBOOKS = sorted((DOCS / "notebooks").glob("*.ipynb"))


def text_outputs(notebook: nbformat.NotebookNode) -> list[list[str]]:
    return [
        [
            output.get("text", "") + output.get("data", {}).get("text/plain", "")
            for output in cell.outputs
            if output.output_type in ("stream", "execute_result")
        ]
        for cell in notebook.cells
        if cell.cell_type == "code"
    ]


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
