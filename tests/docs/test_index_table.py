"""The index's table of what you may be building agrees with the pages.

Each row names a page and an install line; the extras of that line are
those of an install line of the page, so that the table and the page never
tell a reader to install different things.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs.test_install_lines import install_lines

DOCS = Path(__file__).resolve().parent.parent.parent / "docs"


def rows(index: str) -> list[list[str]]:
    """The cells of each row of the index's first list-table, header left out."""
    table = index.split(".. list-table::", 1)[1].split("\n\n", 2)[1]
    found: list[list[str]] = []
    for line in table.splitlines():
        if line.startswith("   * - "):
            found.append([line.removeprefix("   * - ")])
        elif line.startswith("     - "):
            found[-1].append(line.removeprefix("     - "))
    return found[1:]


def disagreements(index: str) -> list[str]:
    wrong = []
    for building, read, _, install in rows(index):
        pages = re.findall(r":doc:`(\w[\w-]*)`", read)
        assert pages, building
        [(extras, _)] = install_lines(install.strip("`"))
        offered = [
            line_extras
            for page in pages
            for line_extras, _ in install_lines((DOCS / f"{page}.rst").read_text())
        ]
        if extras and extras not in offered:
            wrong.append(f"{building}: {sorted(extras)} not in {pages}")
    return wrong


def test_the_index_opens_with_the_table_and_agrees_with_the_pages():
    index = (DOCS / "index.rst").read_text()
    assert index.index(".. list-table::") < index.index(".. toctree::")
    assert [row[0] for row in rows(index)] == [
        "An HTTP service (Starlette, FastAPI, Quart-Trio)",
        "An HTTP service in several worker processes (more cores, reloads)",
        "A WebSocket server",
        "An MCP server",
        "Background jobs",
        "Your own protocol, or a plain Trio service",
    ]
    assert disagreements(index) == []


def test_an_extra_the_page_does_not_name_is_found():
    index = (DOCS / "index.rst").read_text()
    wrong = index.replace('"trio-graceful[mcp]"', '"trio-graceful[mcp,plot]"')
    assert disagreements(wrong) == ["An MCP server: ['mcp', 'plot'] not in ['mcp']"]
