"""Sphinx configuration for trio_graceful."""

from __future__ import annotations

import trio_graceful

project = "trio_graceful"
author = "The trio_graceful authors"
copyright = "2026, The trio_graceful authors"
version = release = trio_graceful.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinxcontrib_trio",
]

default_role = "obj"
nitpicky = True
# The build runs offline, so names from other projects (Trio, the standard
# library) cannot be resolved; every reference to this package must be.
nitpick_ignore_regex = [(r"py:.*", r"(?!trio_graceful\b).*")]

autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the docstrings say it in words, Trio-style
napoleon_google_docstring = True
napoleon_numpy_docstring = False

exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path: list[str] = []
