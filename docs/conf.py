"""Sphinx configuration for trio_graceful."""

from __future__ import annotations

import sys
from pathlib import Path

import trio_graceful
import trio_graceful.asgi
import trio_graceful.jobs
import trio_graceful.lowlevel
import trio_graceful.mcp

# The packages present their names as trio_graceful.X and
# trio_graceful.jobs.X; autodoc needs the real modules to read the docstrings
# of attributes (attrs fields, enum members).
for _package in (
    trio_graceful,
    trio_graceful.jobs,
    trio_graceful.asgi,
    trio_graceful.mcp,
    trio_graceful.lowlevel,
):
    for _name, _module in _package._defined_in.items():
        getattr(_package, _name).__module__ = _module

# The documentation draws some figures with the example programs.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
# Local extensions (the lifecycle's state diagram).
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

project = "trio_graceful"
author = "The trio_graceful authors"
copyright = "2026, The trio_graceful authors"
version = release = trio_graceful.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinxcontrib_trio",
    "matplotlib.sphinxext.plot_directive",
    "myst_nb",
    "lifecycle_diagram",
]

# The notebooks are committed with their outputs (the test suite checks that
# a fresh run prints the same), so the docs show them as they are.
nb_execution_mode = "off"

plot_include_source = False
plot_html_show_source_link = False
plot_html_show_formats = False
plot_formats = [("png", 100)]

default_role = "obj"
nitpicky = True
# The build runs offline, so names from other projects cannot be resolved;
# every reference to this package must be, short names included.
_EXTERNAL = [
    "trio",
    "trio_websocket",
    "trio_asyncio",
    "websockets",
    "outcome",
    "attrs",
    "anyio",
    "hypercorn",
    "starlette",
    "quart_trio",
    "mcp",
    "mcp_types",
    "matplotlib",
    "exceptiongroup",
    "asyncio",
    "collections",
    "contextlib",
    "enum",
    "functools",
    "gc",
    "io",
    "logging",
    "math",
    "os",
    "selectors",
    "signal",
    "socket",
    "subprocess",
    "sys",
    "threading",
    "time",
    "tracemalloc",
    "types",
    "typing",
]
nitpick_ignore_regex = [
    (r"py:.*", rf"({'|'.join(_EXTERNAL)})(\..*)?"),
    # Type variables in the signatures (T, T_co, MessageT, A1, StatusT...), and the
    # private protocols of start_service's overloads (Service0 to Service3):
    # they stand for the caller's types and have no entry of their own.
    (
        r"py:class",
        r"(trio_graceful(\.\w+)*\._\w+\.)?(T|T_co|U|R|PosArgT|P|A\d|MessageT|StatusT|Service\d)",
    ),
    # Trace.plot's matplotlib Axes and Figure, imported only for type checkers (the
    # plot extra is optional), so autodoc sees the bare name.
    (r"py:class", r"Axes|Figure"),
]

autodoc_member_order = "bysource"
# Types go in the description of each parameter and return value, next to
# what the docstring says about them; the signatures stay short.
autodoc_typehints = "description"
# Only for what the docstring describes: no "args (object)" for the classes
# that have no public constructor.
autodoc_typehints_description_target = "documented_params"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

exclude_patterns = ["_build", "**.ipynb_checkpoints"]
html_theme = "alabaster"
html_static_path = ["_static"]
html_theme_options = {
    # Room for 88 columns of code beside the sidebar (see _static/custom.css).
    "page_width": "1160px",
}
