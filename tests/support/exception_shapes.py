"""Exception trees by shape: what a nursery or a bundle raised, compared by type."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup


def shape(exc: BaseException | None) -> Any:
    """Describe an exception tree by types and group messages only."""
    if exc is None:
        return None
    if isinstance(exc, BaseExceptionGroup):
        return (type(exc).__name__, exc.message, [shape(e) for e in exc.exceptions])
    return type(exc).__name__


async def capture(fn: Callable[[], Any]) -> BaseException | None:
    """Run ``await fn()`` and return what it raised (None if nothing)."""
    try:
        await fn()
    except BaseException as exc:
        return exc
    return None


E = TypeVar("E", bound=BaseException)


def only_child_error(got: BaseException | None, kind: type[E]) -> E:
    """Check that ``got`` is what a plain nursery raises when one child raised
    ``kind``, and return that exception."""
    assert shape(got) == (
        "ExceptionGroup",
        "Exceptions from Trio nursery",
        [kind.__name__],
    )
    assert isinstance(got, BaseExceptionGroup)
    error = got.exceptions[0]
    assert isinstance(error, kind)
    return error
