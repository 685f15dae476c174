"""What a bundle can start: async functions, checked before anything starts.

`trio.Nursery.start_soon` calls ``async_fn(*args)`` in the caller, so that a
wrong argument list raises there; a bundle does the same, and refuses a
coroutine object, something not callable, or a function that returns no
coroutine, with a message that says how to call it instead.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Coroutine
from types import CoroutineType, FunctionType, MethodType
from typing import Final, cast

from ._lowlevel import is_async_def

_FUNCTION_TYPES: Final = frozenset({FunctionType, MethodType})


def check_async_fn(async_fn: object, method: str) -> None:
    """Refuse what cannot be an async function, before anything starts.

    Raises:
        TypeError: if ``async_fn`` is a coroutine object (which is closed,
            so that it does not warn that it was never awaited) or is not
            callable.
    """
    if isinstance(async_fn, Coroutine):
        coro_object = cast("Coroutine[object, object, object]", async_fn)
        coro_object.close()
        raise TypeError(
            f"{method}(): async_fn must be an async function, not the coroutine "
            f"object "
            f"{coro_object!r}; pass the function and its arguments instead: "
            f"{method}(fn, *args)"
        )
    if not callable(async_fn):
        raise TypeError(
            f"{method}(): async_fn must be an async function, not {async_fn!r}"
        )


def check_startable(async_fn: object) -> None:
    """Refuse what `trio.Nursery.start` could not start, before anything starts.

    Raises:
        TypeError: as `check_async_fn`, or if ``async_fn`` is a plain function
            that takes no ``task_status`` keyword argument.
    """
    check_async_fn(async_fn, "start")
    if type(async_fn) in _FUNCTION_TYPES and not is_async_def(async_fn):
        # A synchronous function may return a coroutine, but it must take
        # task_status: say so here rather than from inside the child.
        try:
            inspect.signature(cast("Callable[..., object]", async_fn)).bind_partial(
                task_status=None
            )
        except TypeError:
            raise TypeError(
                f"start(): async_fn must be an async function that takes a "
                f"task_status keyword argument, not {async_fn!r}"
            ) from None


def coroutine_of(
    async_fn: Callable[..., Awaitable[object]], args: tuple[object, ...], method: str
) -> Coroutine[object, object, object]:
    """Call ``async_fn(*args)`` and return its coroutine, as Trio's nursery does.

    Calling it in the caller makes a wrong argument list raise there, at once.

    Raises:
        TypeError: if ``async_fn`` is not an async function (see
            `check_async_fn`), or it takes other arguments.
    """
    if type(async_fn) not in _FUNCTION_TYPES:  # the common case, kept cheap
        check_async_fn(async_fn, method)
    return as_coroutine(async_fn, async_fn(*args), method)


def as_coroutine(
    async_fn: object, returned: object, method: str
) -> Coroutine[object, object, object]:
    """Return ``returned``, what ``async_fn`` returned, if it is a coroutine.

    Raises:
        TypeError: if it is not: ``async_fn`` is a plain function.
    """
    if type(returned) is CoroutineType or isinstance(returned, Coroutine):
        return cast("Coroutine[object, object, object]", returned)
    raise TypeError(
        f"{method}(): async_fn must be an async function, but {async_fn!r} returned "
        f"{returned!r} instead of a coroutine; is it missing 'async'?"
    )
