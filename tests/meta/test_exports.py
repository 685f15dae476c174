"""The public surface: every name is written once, in its package's
``if TYPE_CHECKING:`` block, and from there loads on first use, reads as the
package's own (trio_graceful.X, trio_graceful.jobs.X, ...), is listed by
``dir()`` and ``__all__``, and is documented in the package's reference."""

from __future__ import annotations

import ast
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import trio_graceful
import trio_graceful.asgi
import trio_graceful.jobs
import trio_graceful.lowlevel
import trio_graceful.mcp
import trio_graceful.workers

DOCS = Path(__file__).resolve().parents[2] / "docs"
# Each package and the page that holds its reference: docs/reference.rst, a
# section each.
PACKAGES = [
    (trio_graceful, "reference.rst"),
    (trio_graceful.jobs, "reference.rst"),
    (trio_graceful.asgi, "reference.rst"),
    (trio_graceful.mcp, "reference.rst"),
    (trio_graceful.lowlevel, "reference.rst"),
    (trio_graceful.workers, "reference.rst"),
]
# Type aliases described in the text of a function that takes them.
UNLISTED = {"TraceHook"}  # described in add_trace_hook

per_package = pytest.mark.parametrize(
    ("package", "page"), PACKAGES, ids=[package.__name__ for package, _ in PACKAGES]
)


def _public(package: ModuleType) -> list[str]:
    return sorted(name for name in package.__all__ if not name.startswith("_"))


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


def test_every_public_package_is_checked_and_has_a_reference_section():
    subpackages = {
        f"trio_graceful.{module.name}"
        for module in pkgutil.iter_modules(trio_graceful.__path__)
        if module.ispkg and not module.name.startswith("_")
    }
    assert {package.__name__ for package, _ in PACKAGES} == {
        "trio_graceful",
        *subpackages,
    }
    reference = (DOCS / "reference.rst").read_text()
    for name in sorted(subpackages):
        assert f"\n``{name}``: " in reference, name  # its section's title


def test_private_helpers_stay_private():
    # The helper that loads and renames the names is not itself a public name.
    for package, _ in PACKAGES:
        assert not {"lazy_names", "_lazy_names"} & set(vars(package))
        assert not any(inspect.ismodule(getattr(package, n)) for n in _public(package))


def _type_checking_names(package: ModuleType) -> set[str]:
    """The names that ``__init__``'s ``if TYPE_CHECKING:`` block re-exports."""
    assert package.__file__ is not None
    tree = ast.parse(Path(package.__file__).read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for child in node.body:
                assert isinstance(child, ast.ImportFrom)
                for alias in child.names:
                    assert alias.asname == alias.name  # an explicit re-export
                    names.add(alias.name)
    return names


@per_package
def test_every_name_of_the_type_checking_block_loads_and_is_listed(
    package: ModuleType, page: str
):
    names = _type_checking_names(package)
    assert names
    for name in sorted(names):
        assert getattr(package, name) is vars(package)[name]
        assert name in package.__all__
        assert name in dir(package)
    # __all__ holds the block, and the names imported at once (the version)
    assert set(package.__all__) - names <= {"__version__"}
    assert len(package.__all__) == len(set(package.__all__))
    assert sorted(dir(package)) == dir(package)


@per_package
def test_a_star_import_gives_every_public_name(package: ModuleType, page: str):
    namespace: dict[str, object] = {}
    exec(f"from {package.__name__} import *", namespace)
    del namespace["__builtins__"]
    assert sorted(namespace) == sorted(package.__all__)


@per_package
def test_an_unknown_name_is_an_attribute_error_naming_it(
    package: ModuleType, page: str
):
    message = f"^module '{package.__name__}' has no attribute 'Bundel'$"
    with pytest.raises(AttributeError, match=message):
        package.Bundel  # noqa: B018


def _fresh(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


LOADED = (
    "import sys; print(sorted(m for m in sys.modules "
    "if m.startswith('trio_graceful.') or m.split('.')[0] in "
    "{'asyncio', 'h11', 'matplotlib', 'sqlite3', 'psycopg', 'hypercorn', 'mcp'}))"
)


def test_importing_the_packages_loads_no_private_module():
    code = "import trio_graceful, trio_graceful.jobs, trio_graceful.asgi, "
    code += "trio_graceful.mcp, trio_graceful.lowlevel; " + LOADED
    packages = [
        "trio_graceful.asgi",
        "trio_graceful.jobs",
        "trio_graceful.lowlevel",
        "trio_graceful.mcp",
    ]
    assert _fresh(code) == str(
        ["trio_graceful._exports", "trio_graceful._version", *packages]
    )


def test_listing_the_names_loads_no_private_module():
    code = "import trio_graceful; trio_graceful.__all__; dir(trio_graceful); " + LOADED
    assert _fresh(code) == str(["trio_graceful._exports", "trio_graceful._version"])


def test_the_core_loads_no_asyncio_h11_matplotlib_or_job_store():
    root = Path(trio_graceful.__file__).parent
    core = [f"trio_graceful._core.{path.stem}" for path in root.glob("_core/_*.py")]
    loaded = _fresh(f"import {', '.join(core)}; " + LOADED)
    assert "asyncio" not in loaded
    for name in ("h11", "matplotlib", "sqlite3", "psycopg", "jobs", "_children"):
        assert name not in loaded


def test_a_name_reads_as_the_package_own_before_it_is_asked_for():
    # run() loads the lifecycle, and the state tables' error with it: the
    # error reads as trio_graceful's in a traceback though nobody asked the
    # package for it
    code = (
        "import trio_graceful; trio_graceful.run; "
        "from trio_graceful._core._statetable import IllegalTransitionError as E; "
        "print(E.__module__, 'IllegalTransitionError' in vars(trio_graceful))"
    )
    assert _fresh(code) == "trio_graceful True"


def test_defined_in_names_the_private_module_of_every_class_and_function():
    defined_in: dict[str, str] = trio_graceful._defined_in  # type: ignore[attr-defined]
    assert defined_in["Bundle"] == "trio_graceful._core._bundle"
    assert defined_in["InboxReceiver"] == "trio_graceful._core._inbox._receiver"
    assert {*defined_in} >= {
        name
        for name in _public(trio_graceful)
        if _defined_here(getattr(trio_graceful, name))
    }


def test_the_version_has_three_parts_at_least():
    assert trio_graceful.__version__.count(".") >= 2
