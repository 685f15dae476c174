"""The one JSON rule for what jobs carry: payloads, progress and results.

A value is accepted only if it comes back from the store equal to what was
given: dicts with string keys, lists, strings, ints (of fewer than
`MAX_DIGITS` digits), finite floats, bools and None, nested at most
`MAX_DEPTH` deep. Python's `json` would turn a
tuple into a list, the key ``1`` into ``"1"`` and NaN into a token other
parsers refuse; here each is refused before anything is written, with the
path of the offending value (``payload["when"]: datetime is not JSON``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final, cast

#: How deep containers may nest; deeper values (and cycles) are refused.
MAX_DEPTH: Final = 100
#: Digits an int may have: Python's `json` refuses to read (or write) more
#: than 4300 by default, a limit against denial of service.
MAX_DIGITS: Final = 4000
_INT_LIMIT: Final = 10**MAX_DIGITS


class _Refused(Exception):
    """Unwinds the walk, collecting the path on the way out."""

    def __init__(self, error: type[Exception], reason: str) -> None:
        super().__init__(reason)
        self.error = error
        self.reason = reason
        self.steps: list[str] = []


def _walk(value: object, depth: int) -> None:
    if value is None or isinstance(value, str):
        return
    if isinstance(value, int):  # bool too
        if not -_INT_LIMIT < value < _INT_LIMIT:
            raise _Refused(ValueError, f"an int of {MAX_DIGITS}+ digits is not JSON")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Refused(ValueError, f"{value!r} is not JSON (no NaN or infinity)")
        return
    if not isinstance(value, (dict, list)):
        raise _Refused(TypeError, f"{type(value).__name__} is not JSON")
    if depth >= MAX_DEPTH:
        raise _Refused(ValueError, f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        for key, item in cast("dict[object, object]", value).items():
            if not isinstance(key, str):
                raise _Refused(TypeError, f"key {key!r} is not a string")
            _walk_item(item, depth, key)
    else:
        for index, item in enumerate(cast("list[object]", value)):
            _walk_item(item, depth, index)


def _walk_item(item: object, depth: int, key: str | int) -> None:
    try:
        _walk(item, depth + 1)
    except _Refused as refused:
        # The path is spelled only for a refused value.
        step = json.dumps(key, ensure_ascii=False) if isinstance(key, str) else key
        refused.steps.append(f"[{step}]")
        raise


def check_json(value: object, *, what: str) -> None:
    """Refuse ``value`` unless it is JSON that round-trips exactly.

    ``what`` names the value in the message (``payload``, ``result``).

    Raises:
        TypeError: for a value of a type JSON has not, or a key that is not
            a string; the message gives the path, as in
            ``payload["when"]: datetime is not JSON``.
        ValueError: for NaN, an infinity, or nesting deeper than `MAX_DEPTH`.
    """
    try:
        _walk(value, 0)
    except _Refused as refused:
        path = what + "".join(reversed(refused.steps))
        raise refused.error(f"{path}: {refused.reason}") from None


def to_json(value: object, *, what: str) -> str:
    """``value`` as JSON text, after `check_json`."""
    if value is None:  # what most job functions return
        return "null"
    check_json(value, what=what)
    return json.dumps(value)


def check_object(value: object, *, what: str) -> dict[str, Any]:
    """A JSON object (a mapping with string keys) as a dict, after `check_json`.

    Raises:
        TypeError: if ``value`` is not a mapping, or as `check_json`.
        ValueError: as `check_json`.
    """
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{what} must be a mapping with string keys (a JSON object), not {value!r}"
        )
    checked = dict(cast("Mapping[str, Any]", value))
    check_json(checked, what=what)
    return checked
