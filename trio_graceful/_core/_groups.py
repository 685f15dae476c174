"""Exception-group helpers: read a group without caring how deep it nests."""

from __future__ import annotations

import sys
from typing import cast

import trio

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup


def as_group(exc: object) -> BaseExceptionGroup[BaseException] | None:
    """Return ``exc`` typed as an exception group, or None if it is not one."""
    # isinstance() alone narrows to BaseExceptionGroup[Unknown].
    if isinstance(exc, BaseExceptionGroup):
        return cast("BaseExceptionGroup[BaseException]", exc)
    return None


def first_leaf(exc: BaseException) -> BaseException:
    """Return the first exception in ``exc`` that is not a group."""
    group = as_group(exc)
    while group is not None:
        exc = group.exceptions[0]
        group = as_group(exc)
    return exc


def is_cancellation(exc: BaseException) -> bool:
    """True if ``exc`` is `trio.Cancelled`, or a group holding only Cancelled."""
    if isinstance(exc, trio.Cancelled):
        return True
    group = as_group(exc)
    return group is not None and group.split(trio.Cancelled)[1] is None
