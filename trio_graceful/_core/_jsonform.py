"""The JSON form of reports and traces: numbers, times and checks of what is read.

JSON has no infinity, so infinite graces and deadlines are written as the
string ``"inf"``. Wall-clock times are derived from Trio times and an offset
(see `current_wall_clock_offset`); readers rebuild values from Trio times and
the offset alone.
"""

from __future__ import annotations

import enum
import json
import math
import time
from collections.abc import Mapping
from typing import Any, TypeGuard, TypeVar

import trio


def check_type(
    argument: str, value: object, kinds: tuple[type[Any], ...], what: str
) -> None:
    """Raise `TypeError` naming ``argument`` unless ``value`` is one of ``kinds``.

    `bool` counts as an int only if it is listed itself.
    """
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise TypeError(f"{argument} must be {what}, not {value!r}")


def dump_json(data: Mapping[str, Any], indent: object) -> str:
    """Return strict JSON text (no NaN, no infinity) for a ``to_json`` call.

    Raises:
        TypeError: if ``indent`` is not an int or None.
    """
    check_type("indent", indent, (int, type(None)), "an int or None")
    return json.dumps(data, indent=indent, allow_nan=False)  # type: ignore[arg-type]


def current_wall_clock_offset() -> float | None:
    """Return what to add to a Trio time to get a wall-clock time, now.

    `None` outside a Trio run, where there is no Trio clock.
    """
    try:
        now = trio.current_time()
    except RuntimeError:
        return None
    return time.time() - now


def float_to_json(value: float) -> float | str:
    """JSON has no infinity: infinite deadlines and graces are ``"inf"``."""
    return "inf" if value == math.inf else value


def float_from_json(data: Mapping[str, Any], key: str) -> float:
    """Read a float written by `float_to_json`.

    Raises:
        ValueError: if the key is missing or does not hold a number.
    """
    value = data.get(key)
    if value == "inf":
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} must be a number or 'inf', not {value!r}")
    return float(value)


def optional_float_from_json(data: Mapping[str, Any], key: str) -> float | None:
    """Like `float_from_json`, where `None` (JSON ``null``) is allowed too."""
    return None if data.get(key) is None else float_from_json(data, key)


def str_from_json(data: Mapping[str, Any], key: str, *, optional: bool) -> str | None:
    """Read a string (or `None` if ``optional``) from decoded JSON.

    Raises:
        ValueError: if it is missing or of another type.
    """
    value = data.get(key)
    if (value is None and optional) or isinstance(value, str):
        return value
    raise ValueError(f"{key} must be a string, not {value!r}")


E = TypeVar("E", bound=enum.Enum)


def enum_from_json(kind: type[E], data: Mapping[str, Any], key: str) -> E:
    """Read an enum member written as its value.

    Raises:
        ValueError: if the value is not one of the members' values.
    """
    value = data.get(key)
    for member in kind:
        if member.value == value:
            return member
    raise ValueError(f"{key} must be one of {[m.value for m in kind]}, not {value!r}")


def optional_enum_from_json(
    kind: type[E], data: Mapping[str, Any], key: str
) -> E | None:
    """Like `enum_from_json`, where `None` (JSON ``null``) is allowed too."""
    return None if data.get(key) is None else enum_from_json(kind, data, key)


def check_mapping(data: object, what: str) -> Mapping[str, Any]:
    """Return ``data`` if it is a mapping (a decoded JSON object).

    Raises:
        TypeError: if it is not.
    """
    if not isinstance(data, Mapping):
        raise TypeError(f"{what} must be a mapping decoded from JSON, not {data!r}")
    return data  # pyright: ignore[reportUnknownVariableType]


def wall(value: float | None, offset: float | None) -> float | str | None:
    """The wall-clock time of a Trio time, for JSON; None if either is unknown."""
    if value is None or offset is None:
        return None
    return float_to_json(value + offset)


def list_from_json(data: Mapping[str, Any], key: str) -> list[Any]:
    """Read a list from decoded JSON.

    Raises:
        ValueError: if it is missing or not a list.
    """
    value: object = data.get(key)
    if not _is_list(value):
        raise ValueError(f"{key} must be a list, not {value!r}")
    return value


def _is_list(value: object) -> TypeGuard[list[Any]]:
    return isinstance(value, list)


def strings_from_json(data: Mapping[str, Any], key: str) -> tuple[str, ...]:
    """Read a list of strings from decoded JSON, as a tuple.

    Raises:
        ValueError: if it is missing or not a list of strings.
    """
    value = list_from_json(data, key)
    if not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key} must be a list of strings, not {value!r}")
    return tuple(value)


def load_json_object(text: object) -> Mapping[str, Any]:
    """Decode JSON text that must hold an object.

    Raises:
        TypeError: if ``text`` is not a str or bytes.
        ValueError: if it is not valid JSON, or not an object.
    """
    if not isinstance(text, (str, bytes)):
        raise TypeError(f"text must be a str or bytes, not {text!r}")
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"text must hold a JSON object, not {data!r}")
    return data  # pyright: ignore[reportUnknownVariableType]
