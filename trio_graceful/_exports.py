"""A package's public names: loaded on first use, and read as the package's own.

``import trio_graceful`` loads none of the private modules: each public name
is imported from its module the first time something reads it (a module
``__getattr__``), so that asyncio, h11, matplotlib and the job store load
only for those who use them. Every name then reads as ``trio_graceful.X``,
not ``trio_graceful._mod.X``, in tracebacks, reprs and the documentation.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping, MutableMapping

#: The attribute that says where each public name is really defined: the
#: documentation build needs it to find the docstrings of attributes in the
#: source. Reading it loads every name.
DEFINED_IN = "_defined_in"


def lazy_names(
    namespace: MutableMapping[str, object],
    package: str,
    modules: Mapping[str, tuple[str, ...]],
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """Return the ``__getattr__`` and ``__dir__`` of a package that loads on demand.

    Args:
        namespace: The package's ``globals()``; each name is stored there
            once loaded, so that later reads cost nothing.
        package: The package's ``__name__``.
        modules: The names each private module (relative to ``package``, or
            absolute) gives the package.
    """
    where = {
        name: importlib.util.resolve_name(module, package)
        for module, names in modules.items()
        for name in names
    }
    defined_in: dict[str, str] = {}

    def present(name: str, value: object) -> None:
        namespace[name] = value
        module = getattr(value, "__module__", "")
        if isinstance(module, str) and _is_home(package, module, value):
            defined_in[name] = module
            value.__module__ = package  # pyright: ignore[reportAttributeAccessIssue]

    def load(name: str) -> object:
        if name == DEFINED_IN:
            for other in where:
                load(other)
            return defined_in
        module = where.get(name)
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
        return sorted({*namespace, *where})

    return load, names


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
        (inspect.isclass(value) or inspect.isfunction(value))
        and top == package.partition(".")[0]
        and any(part.startswith("_") for part in parts)
    )
