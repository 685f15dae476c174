"""The reference renders what the sources say, checked in a small Sphinx build.

The entries are taken from docs/reference.rst as written, built with autodoc
and napoleon as the documentation is, and read back from the HTML.
"""

from __future__ import annotations

import re
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
NAMES = ("STOP", "TraceEvent", "RunArguments")
CONF = """
import trio_graceful

# As docs/conf.py does, so that autodoc reads the attributes' docstrings.
for name, module in trio_graceful._defined_in.items():
    getattr(trio_graceful, name).__module__ = module

autodoc_member_order = "bysource"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
default_role = "obj"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
"""


def entry(reference: str, name: str) -> str:
    """The directive of docs/reference.rst that documents ``name``, whole."""
    match = re.search(
        rf"^\.\. \w+:: {name}\n(?:(?:   .*)?\n)*", reference, flags=re.MULTILINE
    )
    assert match is not None, name
    return match.group(0)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The text of the built page, tags removed."""
    source = tmp_path_factory.mktemp("docs")
    reference = (ROOT / "docs" / "reference.rst").read_text()
    entries = "\n".join(entry(reference, name) for name in NAMES)
    (source / "conf.py").write_text(CONF)
    (source / "index.rst").write_text(
        f"Reference\n=========\n\n.. module:: trio_graceful\n\n{entries}"
    )
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-q", "-b", "html", ".", "_build"],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    html = (source / "_build" / "index.html").read_text()
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def test_stop_shows_its_own_docstring_not_its_types(rendered: str):
    assert "The message that asks a task to finish its work" in rendered
    assert "The type of STOP, for annotations" not in rendered


def test_trace_event_time_reads_as_written(rendered: str):
    assert (
        "time : float ¶ When, in Trio time ( trio.current_time , which is "
        "monotonic, and virtual under a mock clock)."
    ) in rendered


def test_run_arguments_lists_its_keys(rendered: str):
    start = rendered.index("class trio_graceful. RunArguments")
    keys = re.findall(r"(\w+) : [\w| ]+? ¶", rendered[start:])
    assert keys == [
        "grace",
        "unwind_budget",
        "drain_delay",
        "stop_budget",
        "health_port",
        "health_host",
        "health_max_connections",
    ]
