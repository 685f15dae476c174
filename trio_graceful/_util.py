"""Small helpers shared by the other modules: argument checks and constructors."""

from __future__ import annotations

import math
from abc import ABCMeta
from typing import TypeVar

import trio

T = TypeVar("T")


class NoPublicConstructor(ABCMeta):
    """Metaclass for classes that only a factory function may create.

    ``SomeClass(...)`` raises `TypeError`; the library calls
    ``SomeClass._create(...)`` instead.
    """

    def __call__(cls, *args: object, **kwargs: object) -> None:
        raise TypeError(
            f"{cls.__module__}.{cls.__qualname__} has no public constructor"
        )

    def _create(cls: type[T], *args: object, **kwargs: object) -> T:
        return super().__call__(*args, **kwargs)  # type: ignore[misc, no-any-return]


def check_seconds(name: str, value: object) -> float:
    """Return ``value`` as a float if it is a valid, non-negative duration.

    Raises:
        TypeError: if ``value`` is not an int or a float (`bool` is refused too).
        ValueError: if ``value`` is negative or NaN.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{name} must be a number of seconds, not {type(value).__name__} {value!r}"
        )
    # "not >= 0" also catches NaN, which compares false with everything.
    if not value >= 0:
        raise ValueError(f"{name} must be >= 0, not {value!r}")
    return float(value)


def check_buffer_size(value: object) -> int | float:
    """Validate a channel's ``max_buffer_size`` the way `trio.open_memory_channel` does.

    Raises:
        TypeError: if ``value`` is neither an int nor `math.inf`.
        ValueError: if ``value`` is negative.
    """
    if value != math.inf and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(
            f"max_buffer_size must be an integer or math.inf, not {value!r}"
        )
    assert isinstance(value, (int, float))
    if value < 0:
        raise ValueError(f"max_buffer_size must be >= 0, not {value!r}")
    return value


def in_trio_run(token: trio.lowlevel.TrioToken | None) -> bool:
    """Tell whether the caller runs in the Trio thread of the run of ``token``."""
    try:
        return trio.lowlevel.current_trio_token() is token
    except RuntimeError:  # not in a Trio run at all
        return False
