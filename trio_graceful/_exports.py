"""Presenting a package's public names as its own, not as its private modules'."""

from __future__ import annotations

from collections.abc import MutableMapping


def present_as_package(
    namespace: MutableMapping[str, object], package: str
) -> dict[str, str]:
    """Make the names a package imports from its private modules read as ``package.X``.

    Tracebacks, reprs and the documentation then say ``trio_graceful.X``, not
    ``trio_graceful._mod.X``. Returns where each such name is really defined:
    the documentation build needs it to find the docstrings of attributes in
    the source.
    """
    defined_in: dict[str, str] = {}
    for name, value in list(namespace.items()):
        if name.startswith("_"):
            continue
        module = getattr(value, "__module__", "")
        if isinstance(module, str) and module.startswith(f"{package}._"):
            defined_in[name] = module
            value.__module__ = package
    return defined_in
