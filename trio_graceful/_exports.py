"""A package's public names: loaded on first use, and read as the package's own.

``import trio_graceful`` loads none of the private modules: each public name
is imported from its module the first time something reads it (a module
``__getattr__``), so that asyncio, h11, matplotlib and the job store load
only for those who use them. Every name then reads as ``trio_graceful.X``,
not ``trio_graceful._mod.X``, in tracebacks, reprs and the documentation.

The names are written once, in the package's ``if TYPE_CHECKING:`` block, as
explicit re-exports (``from ._bundle import Bundle as Bundle``): type
checkers read them there, and at the first use of any name the package's own
source is parsed to find them. ``__all__`` is every explicit re-export of the
package, those of the block and those imported at once (``__version__``).
"""

# No ``from __future__ import annotations``: importing ``__future__`` would
# be most of what ``import trio_graceful`` costs here.
import importlib
import sys
import types
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from importlib.abc import InspectLoader

#: The attribute that says where each public name is really defined: the
#: documentation build needs it to find the docstrings of attributes in the
#: source. Reading it loads every name.
DEFINED_IN = "_defined_in"


def lazy_names(
    namespace: MutableMapping[str, object],
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """Return the ``__getattr__`` and ``__dir__`` of a package that loads on demand.

    Args:
        namespace: The package's ``globals()``; each name is stored there
            once loaded, so that later reads cost nothing.
    """
    package = str(namespace["__name__"])
    # Filled from the package's source at the first use of any name.
    where: dict[str, str] = {}
    defined_in: dict[str, str] = {}

    def table() -> dict[str, str]:
        if not where:
            lazy, eager = _read_exports(namespace)
            where.update(lazy)
            namespace["__all__"] = sorted({*lazy, *eager})
        return where

    def present(name: str, value: object) -> None:
        namespace[name] = value
        module = getattr(value, "__module__", "")
        if isinstance(module, str) and _is_home(package, module, value):
            defined_in[name] = module
            value.__module__ = package  # pyright: ignore[reportAttributeAccessIssue]

    def load(name: str) -> object:
        if name == "__all__":
            table()
            return namespace[name]
        if name == DEFINED_IN:
            for other in table():
                load(other)
            return defined_in
        module = table().get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if name in namespace:
            return namespace[name]
        present(name, getattr(importlib.import_module(module), name))
        # The names of the modules loaded meanwhile read as the package's too,
        # though nobody has asked for them here yet (an exception class in a
        # traceback, say).
        for other, source in where.items():
            loaded = sys.modules.get(source)
            if other not in namespace and loaded is not None:
                present(other, getattr(loaded, other))
        return namespace[name]

    def names() -> list[str]:
        return sorted({*namespace, *table()})

    return load, names


def _read_exports(
    namespace: MutableMapping[str, object],
) -> tuple[dict[str, str], set[str]]:
    """Read the package's explicit re-exports from its ``__init__``'s source.

    Returns each name of the ``if TYPE_CHECKING:`` block with the module it
    comes from, and the names re-exported at once, outside the block.
    """
    # Only at the first use of a name, so that ``import`` stays cheap.
    import ast

    package = str(namespace["__name__"])
    source = cast("InspectLoader", namespace["__loader__"]).get_source(package)
    if source is None:
        raise ImportError(f"{package} cannot list its names without its source")
    lazy: dict[str, str] = {}
    eager: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom):
                    # ``from .._core._trace import`` in trio_graceful.lowlevel
                    # is trio_graceful._core._trace (importlib.util would cost
                    # an import).
                    level = statement.level
                    base = package.rsplit(".", level - 1)[0] if level else ""
                    module = ".".join(filter(None, (base, statement.module)))
                    lazy.update(
                        (alias.name, module)
                        for alias in statement.names
                        if alias.asname == alias.name
                    )
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            eager.update(a.name for a in node.names if a.asname == a.name)
    return lazy, eager


def _is_home(package: str, module: str, value: object) -> bool:
    """Tell whether ``package`` is the public home of ``value``, from ``module``.

    Whatever its private modules define is its own. A class or function from
    a private module of another layer is its own too (`trio_graceful.lowlevel`
    is the home of the trace hooks of ``_core``); an instance of another
    layer's class is not (``trio_graceful.mcp.EXIT_CODES`` is an
    `trio_graceful.ExitCodes`).
    """
    if module.startswith(f"{package}._"):
        return True
    top, *parts = module.split(".")
    return (
        isinstance(value, (type, types.FunctionType))
        and top == package.partition(".")[0]
        and any(part.startswith("_") for part in parts)
    )
