"""Low-level helpers: the small pieces of Trio plumbing that many modules share.

Objects without a public constructor, an abort function for waits that must
end, which run a caller is in, what ``async def`` is, the name of a signal,
and a task status that passes ``started()`` on.
"""

from __future__ import annotations

import inspect
import signal
from abc import ABCMeta
from collections.abc import Callable
from typing import Any, TypeVar, final

import attrs
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


def forbid_abort(_: object) -> trio.lowlevel.Abort:
    """The abort function of a `trio.lowlevel.wait_task_rescheduled` that must end.

    Only a reschedule ends the wait, as for Trio's nursery waiting for its
    children: a cancel is refused, and a KeyboardInterrupt stays pending
    until the next checkpoint.
    """
    return trio.lowlevel.Abort.FAILED


def in_run_of(token: trio.lowlevel.TrioToken | None) -> bool:
    """Tell whether the caller runs in the Trio thread of the run of ``token``.

    Unlike `trio.lowlevel.in_trio_run`, which asks whether the caller is in
    any run, this asks whether it is in that one.
    """
    try:
        return trio.lowlevel.current_trio_token() is token
    except RuntimeError:  # not in a Trio run at all
        return False


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
