"""Small helpers shared by the other modules: argument checks, signals, groups."""

from __future__ import annotations

import inspect
import math
import signal
import sys
from abc import ABCMeta
from collections.abc import Callable
from typing import Any, TypeVar, cast, final

import attrs
import trio

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

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


def forbid_abort(_: object) -> trio.lowlevel.Abort:
    """The abort function of a `trio.lowlevel.wait_task_rescheduled` that must end.

    Only a reschedule ends the wait, as for Trio's nursery waiting for its
    children: a cancel is refused, and a KeyboardInterrupt stays pending
    until the next checkpoint.
    """
    return trio.lowlevel.Abort.FAILED


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
    try:
        return float(value)
    except OverflowError:  # an int beyond any float: longer than forever
        return math.inf


def check_port(name: str, value: object) -> int:
    """Return ``value`` if it is a TCP port number (0 picks a free one).

    Raises:
        TypeError: if ``value`` is not an int (`bool` is refused too).
        ValueError: if ``value`` is not in 0..65535.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a port number, not {value!r}")
    if not 0 <= value <= 65535:
        raise ValueError(f"{name} must be a port number in 0..65535, not {value!r}")
    return value


def check_buffer_size(value: object) -> int | float:
    """Validate a channel's ``max_buffer_size`` the way `trio.open_memory_channel` does.

    Raises:
        TypeError: if ``value`` is neither an int nor `math.inf`.
        ValueError: if ``value`` is negative.
    """
    # Exactly int or float infinity: Decimal("Infinity") == math.inf too.
    if isinstance(value, bool) or not (
        isinstance(value, int) or (isinstance(value, float) and value == math.inf)
    ):
        raise TypeError(
            f"max_buffer_size must be an integer or math.inf, not {value!r}"
        )
    if value < 0:
        raise ValueError(f"max_buffer_size must be >= 0, not {value!r}")
    return value


def in_trio_run(token: trio.lowlevel.TrioToken | None) -> bool:
    """Tell whether the caller runs in the Trio thread of the run of ``token``."""
    try:
        return trio.lowlevel.current_trio_token() is token
    except RuntimeError:  # not in a Trio run at all
        return False


def check_name(value: object, *, argument: str = "name") -> str | None:
    """Return ``value`` if it is a string or None.

    Raises:
        TypeError: if it is anything else; the message names ``argument``.
    """
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{argument} must be a string or None, not {value!r}")
    return value


def check_signal(value: object, *, argument: str) -> int:
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


def signal_name(signum: int) -> str:
    """``"SIGINT"`` for 2; ``"signal 40"`` for a signal Python has no name for."""
    try:
        return signal.Signals(signum).name
    except ValueError:  # real-time signals have no names of their own
        return f"signal {signum}"


def is_async_def(fn: object) -> bool:
    """Tell whether ``fn`` is an ``async def`` function (or a method of one)."""
    code = getattr(fn, "__code__", None)
    return code is not None and bool(code.co_flags & inspect.CO_COROUTINE)


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


@final
@attrs.define(eq=False, slots=False)
class ForwardingTaskStatus(trio.TaskStatus[Any]):
    """Passes ``task_status.started()`` on, remembers it, and calls a hook."""

    _real: trio.TaskStatus[Any]
    _on_started: Callable[[], object] | None = None
    started_called: bool = False

    def started(self, value: Any = None) -> None:
        self._real.started(value)
        self.started_called = True
        if self._on_started is not None:
            self._on_started()
