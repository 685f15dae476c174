"""The public surface: every name is exported once, reads as trio_graceful.X
and is documented in the reference."""

from __future__ import annotations

import inspect
from pathlib import Path

import trio_graceful

PUBLIC = sorted(
    name
    for name in vars(trio_graceful)
    if not name.startswith("_") and not inspect.ismodule(getattr(trio_graceful, name))
)
REFERENCE = (Path(__file__).parent.parent / "docs" / "reference.rst").read_text()


def _defined_here(value: object) -> bool:
    # classes and functions, not type aliases such as TraceHook (which
    # inspect.isclass() accepts on Python 3.10)
    return (inspect.isclass(value) or inspect.isfunction(value)) and not hasattr(
        value, "__origin__"
    )


def test_public_names_read_as_the_package():
    for name in PUBLIC:
        value = getattr(trio_graceful, name)
        if _defined_here(value):
            assert value.__module__ == "trio_graceful", name
            assert value.__qualname__ == name, name


def test_public_names_are_documented():
    undocumented = [
        name
        for name in PUBLIC
        if name != "TraceHook"  # a type alias, described in add_trace_hook
        and f":: {name}\n" not in REFERENCE
        and f":: {name}(" not in REFERENCE
    ]
    assert undocumented == []


def test_no_private_module_leaks_a_public_name_twice():
    seen: dict[int, str] = {}
    for name in PUBLIC:
        value = getattr(trio_graceful, name)
        if _defined_here(value):
            assert id(value) not in seen, (name, seen.get(id(value)))
            seen[id(value)] = name


def test_version():
    assert trio_graceful.__version__.count(".") >= 2
