"""Arbitrary values for every argument of the children of other kinds.

Whatever is passed, `run_in_thread`, `run_process`, `run_asyncio`,
`ThreadBudget`, `AdmissionGate` and `StopFlag.wait` either accept it or
refuse it at the call with a `TypeError` or `ValueError` that names the
argument and shows the value, before a thread, a process or an asyncio task
exists.
"""

from __future__ import annotations

import math
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, strategies as st

from trio_graceful import (
    AdmissionGate,
    StopFlag,
    ThreadBudget,
    open_bundle,
    run_asyncio,
    run_in_thread,
    run_process,
)

# Values of every common kind, the odd ones included (huge and non-finite
# numbers, bytes, containers, a bare object).
anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**300, max_value=10**400),
    st.floats(),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.lists(st.one_of(st.integers(), st.text(max_size=2)), max_size=3),
    st.tuples(st.integers()),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.builds(object),
)


def is_bool(value: object) -> bool:
    return isinstance(value, bool)


def is_path(value: object) -> bool:
    return isinstance(value, (str, bytes, os.PathLike))


def valid_command(value: object) -> bool:
    parts = [value] if is_path(value) else value
    return (
        isinstance(parts, (list, tuple))
        and bool(parts)
        and all(is_path(part) for part in parts)
        and bool(os.fspath(parts[0]))
    )


def valid_stdin(value: object) -> bool:
    return not isinstance(value, bool) and (
        value is None
        or isinstance(value, (bytes, bytearray, memoryview, int))
        or hasattr(value, "fileno")
    )


def valid_signal(value: object) -> bool:
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value in signal.valid_signals()
    )


def valid_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def valid_timeout(value: object) -> bool:
    return value is None or (
        isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
    )


def check_refusal(exc: BaseException, argument: str, value: object) -> None:
    assert isinstance(exc, (TypeError, ValueError)), repr(exc)
    message = str(exc)
    assert message.startswith(f"{argument} must "), message
    assert message.endswith(repr(value)) or f"{value!r}" in message, message


async def refused_in_a_child(
    call: Callable[[], Any], argument: str, value: object
) -> None:
    """Make ``call()`` in a child of a bundle; it must refuse ``value``."""
    errors: list[BaseException] = []

    async def child() -> None:
        try:
            await call()
        except BaseException as exc:  # checked below
            errors.append(exc)

    async with open_bundle() as bundle:
        bundle.start_soon(child)
        await trio.testing.wait_all_tasks_blocked()
        assert bundle.statistics().inboxes == 0  # no asyncio task either
    (exc,) = errors
    check_refusal(exc, argument, value)
    assert trio.testing.active_thread_count() == 0


def never_called(flag: StopFlag) -> None:
    raise AssertionError("the thread must not start")  # pragma: no cover


async def aio_never_called(inbox: object) -> None:
    raise AssertionError("the task must not start")  # pragma: no cover


# A missing program: had the arguments been accepted, starting it would
# have raised FileNotFoundError instead. No trio-asyncio loop is open either:
# run_asyncio would have failed for want of one.
MISSING = ["/nonexistent/program"]


def call_with(function: Any, first: object, argument: str) -> Callable[[object], Any]:
    """Return ``value -> function(first, argument=value)``; the first argument
    itself when ``argument`` names it."""
    if argument in ("sync_fn", "command", "aio_fn"):
        return lambda value: function(value)
    return lambda value: function(first, **{argument: value})


def is_none(value: object) -> bool:
    return value is None


# (function, the first argument it is given, argument, which values are valid)
ARGUMENTS: list[tuple[Any, object, str, Callable[[object], bool]]] = [
    (run_in_thread, never_called, "sync_fn", callable),
    (run_in_thread, never_called, "bundle", is_none),
    (run_in_thread, never_called, "name", lambda v: v is None or isinstance(v, str)),
    (run_in_thread, never_called, "budget", is_none),
    (run_in_thread, never_called, "gate", is_none),
    (run_process, MISSING, "command", valid_command),
    (run_process, MISSING, "bundle", is_none),
    (run_process, MISSING, "stop_signal", valid_signal),
    (run_process, MISSING, "start_new_session", is_bool),
    (run_process, MISSING, "stdin", valid_stdin),
    (run_process, MISSING, "capture_stdout", is_bool),
    (run_process, MISSING, "capture_stderr", is_bool),
    (run_process, MISSING, "check", is_bool),
    (run_asyncio, aio_never_called, "aio_fn", callable),
    (run_asyncio, aio_never_called, "bundle", is_none),
    (run_asyncio, aio_never_called, "inbox", is_none),
]


@pytest.mark.parametrize(
    ("function", "first", "argument", "valid"),
    ARGUMENTS,
    ids=[f"{case[0].__name__}-{case[2]}" for case in ARGUMENTS],
)
@given(value=anything)
async def test_children_refuse_bad_arguments_before_they_start(
    function: Any,
    first: object,
    argument: str,
    valid: Callable[[object], bool],
    value: object,
) -> None:
    if not valid(value):
        call = call_with(function, first, argument)
        await refused_in_a_child(lambda: call(value), argument, value)


# -- which bundle --------------------------------------------------------------------

CHILDREN = [
    (run_in_thread, never_called),
    (run_process, MISSING),
    (run_asyncio, aio_never_called),
]


def child_of_b(name: str) -> str:
    return (
        rf"^{name}\(\) must be called by a child of bundle 'b' \(a task started "
        rf"with its start_soon\(\) or start\(\)\), not by <Task .+ at 0x[0-9a-f]+>$"
    )


@pytest.mark.parametrize(("function", "first"), CHILDREN)
@pytest.mark.parametrize("explicit", [True, False])
async def test_the_body_of_a_bundle_is_not_its_child(
    function: Any, first: object, explicit: bool
) -> None:
    # By default the bundle is the one whose body calls: not its child either.
    async with open_bundle(name="b") as bundle:
        with pytest.raises(RuntimeError, match=child_of_b(function.__name__)):
            await function(first, bundle=bundle if explicit else None)
        assert bundle.statistics().inboxes == 0
    assert trio.testing.active_thread_count() == 0


@pytest.mark.parametrize(("function", "first"), CHILDREN)
async def test_a_task_below_a_child_is_not_a_child(
    function: Any, first: object
) -> None:
    refused: list[str] = []

    async def grandchild() -> None:
        for explicit in (None, bundle):
            with pytest.raises(RuntimeError, match=child_of_b(function.__name__)):
                await function(first, bundle=explicit)
            refused.append("refused")

    async def child() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(grandchild)

    async with open_bundle(name="b") as bundle:
        bundle.start_soon(child)
    assert refused == ["refused"] * 2


@pytest.mark.parametrize(("function", "first"), CHILDREN)
async def test_outside_any_bundle_the_error_says_how_to_call_it(
    function: Any, first: object
) -> None:
    name = function.__name__
    with pytest.raises(
        RuntimeError,
        match=(
            rf"^{name}\(\) must be called by a child of a bundle \(a task "
            rf"started with its start_soon\(\) or start\(\)\), not by "
            rf"<Task .+ at 0x[0-9a-f]+>; or pass the bundle as bundle=$"
        ),
    ):
        await function(first)
    assert trio.testing.active_thread_count() == 0


@given(value=anything)
def test_thread_budget(value: object) -> None:
    if valid_count(value):
        assert ThreadBudget(value).total_tokens == value  # type: ignore[arg-type]
        return
    with pytest.raises((TypeError, ValueError)) as info:
        ThreadBudget(value)  # type: ignore[arg-type]
    check_refusal(info.value, "total_tokens", value)


@given(quota=anything, name=anything)
def test_admission_gate(quota: object, name: object) -> None:
    name_ok = name is None or isinstance(name, str)
    if valid_count(quota) and name_ok:
        gate = AdmissionGate(quota, name=name)  # type: ignore[arg-type]
        assert (gate.quota, gate.name) == (quota, name)
        return
    with pytest.raises((TypeError, ValueError)) as info:
        AdmissionGate(quota, name=name)  # type: ignore[arg-type]
    if valid_count(quota):
        check_refusal(info.value, "name", name)
    else:
        check_refusal(info.value, "quota", quota)


@given(timeout=anything)
def test_stop_flag_wait(timeout: object) -> None:
    event = threading.Event()
    event.set()  # a valid timeout returns at once
    flag = StopFlag._create(event)  # pyright: ignore[reportPrivateUsage]
    if valid_timeout(timeout) and not (
        isinstance(timeout, float) and math.isnan(timeout)
    ):
        assert flag.wait(timeout) is True  # type: ignore[arg-type]
        return
    with pytest.raises((TypeError, ValueError)) as info:
        flag.wait(timeout)  # type: ignore[arg-type]
    check_refusal(info.value, "timeout", timeout)
