"""Argument checks: every check of the package's general arguments, one vocabulary.

Each check takes the argument's name first and its value second, returns the
value (made a float for durations), and raises `TypeError` for a wrong type
and `ValueError` for a wrong value, with a message that names the argument
and the value in the same words everywhere: ``grace must be >= 0, not -1``,
``quota must be an int, not 1.5``. `field_check` turns any of them into an
attrs validator that names the field as its caller spells it.

A check for one option alone stays beside that option; a check here is one
that more than one place needs, or one that must read the same everywhere.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Callable
from typing import Any

import attrs


def field_check(
    check: Callable[[str, Any], object],
) -> Callable[[object, attrs.Attribute[Any], object], None]:
    """Return an attrs validator that runs ``check`` with the field's name.

    The name is the field's ``alias``, the keyword its caller passes (an
    attribute ``_quota`` is the argument ``quota``).
    """

    def validate(
        instance: object, attribute: attrs.Attribute[Any], value: object
    ) -> None:
        del instance
        check(attribute.alias or attribute.name, value)

    return validate


def check_bool(argument: str, value: object) -> bool:
    """Return ``value`` if it is `True` or `False`.

    Raises:
        TypeError: if it is anything else (``0`` and ``1`` too).
    """
    if not isinstance(value, bool):
        raise TypeError(f"{argument} must be True or False, not {value!r}")
    return value


def check_name(argument: str, value: object) -> str | None:
    """Return ``value`` if it is a string or None.

    Raises:
        TypeError: if it is anything else.
    """
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{argument} must be a string or None, not {value!r}")
    return value


def check_string(argument: str, value: object) -> str:
    """Return ``value`` if it is a string.

    Raises:
        TypeError: if it is anything else.
    """
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a string, not {value!r}")
    return value


def check_int(argument: str, value: object) -> int:
    """Return ``value`` if it is an `int` (a `bool` is refused).

    Raises:
        TypeError: if it is anything else.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be an int, not {value!r}")
    return value


def check_count(argument: str, value: object) -> int:
    """Return ``value`` if it is an `int` (not a `bool`) of at least 1.

    Raises:
        TypeError: if it is not an int.
        ValueError: if it is less than 1.
    """
    count = check_int(argument, value)
    if count < 1:
        raise ValueError(f"{argument} must be >= 1, not {count!r}")
    return count


def check_seconds(argument: str, value: object) -> float:
    """Return ``value`` as a float if it is a valid, non-negative duration.

    `math.inf` is valid (forever), and so is an int too large for a float.

    Raises:
        TypeError: if ``value`` is not an int or a float (`bool` is refused too).
        ValueError: if ``value`` is negative or NaN.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{argument} must be a number of seconds, "
            f"not {type(value).__name__} {value!r}"
        )
    # "not >= 0" also catches NaN, which compares false with everything.
    if not value >= 0:
        raise ValueError(f"{argument} must be >= 0, not {value!r}")
    try:
        return float(value)
    except OverflowError:  # an int beyond any float: longer than forever
        return math.inf


def check_port(argument: str, value: object) -> int:
    """Return ``value`` if it is a TCP port number (0 picks a free one).

    Raises:
        TypeError: if ``value`` is not an int (`bool` is refused too).
        ValueError: if ``value`` is not in 0..65535.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be a port number, not {value!r}")
    if not 0 <= value <= 65535:
        raise ValueError(f"{argument} must be a port number in 0..65535, not {value!r}")
    return value


def check_signal(argument: str, value: object) -> int:
    """Return ``value`` if it is a signal number this process can send or catch.

    Raises:
        TypeError: if ``value`` is not an int (`bool` is refused too).
        ValueError: if it is not a valid signal number here.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be a signal number, not {value!r}")
    if value not in signal.valid_signals():
        raise ValueError(f"{argument} must be a valid signal number, not {value!r}")
    return value


def check_buffer_size(argument: str, value: object) -> int | float:
    """Return a channel's buffer size, checked as `trio.open_memory_channel` does.

    Raises:
        TypeError: if ``value`` is neither an int nor `math.inf`.
        ValueError: if ``value`` is negative.
    """
    # Exactly int or float infinity: Decimal("Infinity") == math.inf too.
    if isinstance(value, bool) or not (
        isinstance(value, int) or (isinstance(value, float) and value == math.inf)
    ):
        raise TypeError(f"{argument} must be an int or math.inf, not {value!r}")
    if value < 0:
        raise ValueError(f"{argument} must be >= 0, not {value!r}")
    return value
