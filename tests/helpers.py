"""Helpers shared by the tests."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import trio

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


class StepCounter(trio.abc.Instrument):
    """Counts how often each task is stepped by the scheduler."""

    def __init__(self) -> None:
        self.steps: dict[trio.lowlevel.Task, int] = {}

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps[task] = self.steps.get(task, 0) + 1


class StreamLog:
    """What a subprocess writes to a pipe (its stderr), kept as it comes.

    Run `collect` as a task; then a test can wait for a line to appear, or
    for the end of the stream, with a bound against hangs.
    """

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.data = b""
        self._stream = stream
        self._changed = trio.Event()
        self._closed = trio.Event()

    async def collect(self) -> None:
        while data := await self._stream.receive_some():
            self.data += data
            self._changed.set()
            self._changed = trio.Event()
        self._closed.set()

    async def wait_for(self, text: str, *, timeout: float) -> None:
        with trio.fail_after(timeout):
            while text.encode() not in self.data:
                await self._changed.wait()

    async def wait_closed(self, *, timeout: float) -> None:
        with trio.fail_after(timeout):
            await self._closed.wait()
