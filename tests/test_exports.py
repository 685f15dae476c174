"""The public surface: every name is exported once, reads as the package's
own (trio_graceful.X, trio_graceful.jobs.X, ...) and is documented in the
package's reference."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType

import pytest

import trio_graceful
import trio_graceful.asgi
import trio_graceful.jobs
import trio_graceful.mcp

DOCS = Path(__file__).parent.parent / "docs"
# Each package and the page that holds its reference.
PACKAGES = [
    (trio_graceful, "reference.rst"),
    (trio_graceful.jobs, "jobs.rst"),
    (trio_graceful.asgi, "asgi.rst"),
    (trio_graceful.mcp, "reference.rst"),
]
# Type aliases described in the text of a function that takes them.
UNLISTED = {"TraceHook"}  # described in add_trace_hook

per_package = pytest.mark.parametrize(
    ("package", "page"), PACKAGES, ids=[package.__name__ for package, _ in PACKAGES]
)


def _public(package: ModuleType) -> list[str]:
    return sorted(
        name
        for name in vars(package)
        if not name.startswith("_") and not inspect.ismodule(getattr(package, name))
    )


def _defined_here(value: object) -> bool:
    # classes and functions, not type aliases such as TraceHook (which
    # inspect.isclass() accepts on Python 3.10)
    return (inspect.isclass(value) or inspect.isfunction(value)) and not hasattr(
        value, "__origin__"
    )


@per_package
def test_public_names_read_as_the_package(package: ModuleType, page: str):
    checked = 0
    for name in _public(package):
        value = getattr(package, name)
        if _defined_here(value):
            assert value.__module__ == package.__name__, name
            assert value.__qualname__ == name, name
            checked += 1
    assert checked > 0


@per_package
def test_public_names_are_documented(package: ModuleType, page: str):
    reference = (DOCS / page).read_text()
    assert f".. module:: {package.__name__}\n" in reference
    undocumented = [
        name
        for name in _public(package)
        if name not in UNLISTED
        and f":: {name}\n" not in reference
        and f":: {name}(" not in reference
    ]
    assert undocumented == []


@per_package
def test_no_private_module_leaks_a_public_name_twice(package: ModuleType, page: str):
    seen: dict[int, str] = {}
    for name in _public(package):
        value = getattr(package, name)
        if _defined_here(value):
            assert id(value) not in seen, (name, seen.get(id(value)))
            seen[id(value)] = name


def test_private_helpers_stay_private():
    # The helper that renames the modules is not itself a public name.
    for package, _ in PACKAGES:
        assert "present_as_package" not in vars(package)
        assert "_present_as_package" not in vars(package)


def test_version():
    assert trio_graceful.__version__.count(".") >= 2
