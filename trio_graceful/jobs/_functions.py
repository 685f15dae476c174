"""What a job function is, and the check of a worker's functions at its construction.

A worker must not find out that a function is unusable only when a job of
its kind runs (and fails): `check_functions` refuses it at once, naming the
kind.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from ._context import JobContext
from ._jobchecks import check_text

# Documented in docs/jobs.rst: what counts as async is what
# inspect.iscoroutinefunction tells (async def, methods, partials, objects
# whose __call__ is async def).
JobFunction = Callable[[JobContext], Awaitable[Any]]


def check_functions(functions: object) -> Mapping[str, JobFunction]:
    """``functions`` as a read-only copy, if each kind maps to an async function.

    Raises:
        TypeError: if ``functions`` is not a mapping, a kind is not a string,
            or a function is not async.
        ValueError: if ``functions`` is empty, or a kind is empty or not
            text both stores hold.
    """
    if not isinstance(functions, Mapping):
        raise TypeError(
            "functions must be a mapping of job kind to async function, "
            f"not {functions!r}"
        )
    checked: dict[str, JobFunction] = {}
    for kind, fn in cast("Mapping[object, object]", functions).items():
        kind = check_text(kind, argument="job kind")
        if not (
            inspect.iscoroutinefunction(fn)
            or inspect.iscoroutinefunction(type(fn).__call__)
        ):
            raise TypeError(
                f"the function of job kind {kind!r} must be an async function "
                f"(async def), not {fn!r}"
            )
        checked[kind] = cast("JobFunction", fn)
    if not checked:
        raise ValueError("functions must name at least one job kind")
    return types.MappingProxyType(checked)
