"""The one JSON rule of payloads, progress and results, by generated values.

Accepted values come back from a real store of each kind exactly as given
(types included: ``1``, ``1.0`` and ``True`` are told apart); a value with
one bad part planted at a random path is refused with that path.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from typing import Any, cast

import pytest
import trio
from hypothesis import HealthCheck, given, settings, strategies as st

from trio_graceful.jobs import open_store
from trio_graceful.jobs._jsonrule import MAX_DEPTH, MAX_DIGITS, check_json, to_json

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4)
    ),
    max_leaves=20,
)


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (-0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        keys: list[Any] = list(cast("dict[Any, Any]", a))
        return keys == list(b) and all(same(a[k], b[k]) for k in keys)
    if isinstance(a, list):
        items: list[Any] = cast("list[Any]", a)
        return len(items) == len(b) and all(map(same, items, b))
    if isinstance(a, float):
        return repr(a) == repr(b)
    return bool(a == b)


@given(json_values)
def test_accepted_values_round_trip_through_the_rule(value: Any) -> None:
    assert same(json.loads(to_json(value, what="result")), value)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.dictionaries(st.text(), json_values, max_size=5))
def test_accepted_payloads_round_trip_through_the_store(
    store_url: str, payload: dict[str, Any]
) -> None:
    async def round_trip() -> None:
        with open_store(store_url, offload=False) as store:
            job_id = await store.submit("k", payload)
            assert same(dict((await store.get(job_id)).payload), payload)

    trio.run(round_trip)


class Bad:
    """A value of a class JSON has not."""


# (the planted value, the exception, what the message says of it)
BAD_LEAVES: list[tuple[Any, type[Exception], str]] = [
    (datetime.date(2026, 1, 1), TypeError, "date is not JSON"),
    (math.nan, ValueError, "nan is not JSON (no NaN or infinity)"),
    (math.inf, ValueError, "inf is not JSON (no NaN or infinity)"),
    (-math.inf, ValueError, "-inf is not JSON (no NaN or infinity)"),
    ((1, 2), TypeError, "tuple is not JSON"),
    ({1}, TypeError, "set is not JSON"),
    (b"x", TypeError, "bytes is not JSON"),
    (-(10**4000), ValueError, "an int of 4000+ digits is not JSON"),
    (Bad(), TypeError, "Bad is not JSON"),
]


@st.composite
def planted(draw: st.DrawFn) -> tuple[Any, type[Exception], str]:
    """A JSON value with one bad part, its exception and its whole message."""
    if draw(st.booleans()):
        leaf, error, reason = draw(st.sampled_from(BAD_LEAVES))
    else:
        key = draw(st.integers() | st.none() | st.tuples(st.integers()))
        leaf = {key: draw(json_values)}
        error, reason = TypeError, f"key {key!r} is not a string"
    value: Any = leaf
    path = ""
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.booleans()):
            before = draw(st.lists(json_values, max_size=3))
            value = [*before, value, *draw(st.lists(json_values, max_size=2))]
            path = f"[{len(before)}]{path}"
        else:
            key = draw(st.text())
            siblings = draw(st.dictionaries(st.text(), json_values, max_size=3))
            siblings.pop(key, None)
            value = {**siblings, key: value}
            path = f"[{json.dumps(key, ensure_ascii=False)}]{path}"
    return value, error, f"result{path}: {reason}"


@given(planted())
def test_a_bad_part_is_refused_with_its_path(
    case: tuple[Any, type[Exception], str],
) -> None:
    value, error, message = case
    with pytest.raises(error) as caught:
        check_json(value, what="result")
    assert str(caught.value) == message


def test_the_largest_int() -> None:
    largest = 10**MAX_DIGITS - 1
    assert json.loads(to_json([largest, -largest], what="result")) == [
        largest,
        -largest,
    ]


def test_nesting_and_cycles_are_bounded() -> None:
    deep: list[Any] = []
    for _ in range(MAX_DEPTH - 1):
        deep = [deep]
    check_json(deep, what="payload")  # MAX_DEPTH containers: the limit
    too_deep = "payload" + "[0]" * MAX_DEPTH + ": nested deeper than 100 levels"
    with pytest.raises(ValueError, match=f"^{re.escape(too_deep)}$"):
        check_json([deep], what="payload")
    cycle: dict[str, Any] = {}
    cycle["self"] = cycle
    cyclic = "payload" + '["self"]' * MAX_DEPTH + ": nested deeper than 100 levels"
    with pytest.raises(ValueError, match=f"^{re.escape(cyclic)}$"):
        check_json(cycle, what="payload")
