"""Services and resources: started in order, stopped in reverse order.

A *service* is a task that starts, says it is ready (``task_status.started``)
and runs until `STOP` reaches its own inbox. A *resource* is an async context
manager; it is held open by a small service of its own, so that both kinds
share one ordered list and one stop sequence:

* ``start`` runs a service until it is ready and appends it to the list; if it
  raises before it is ready, the error goes to the caller and nothing is
  appended (the caller decides whether that fails the program).
* ``stop(deadline)`` sends STOP to the last service, waits for it to end,
  then the one before, and so on; at ``deadline`` the bundle hard-cancels
  whatever is left. One deadline bounds the whole sequence.

All services run as children of one bundle, so a hard cancel of that bundle
ends every one of them at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast, final

import attrs
import trio

from ..._core._bundle import Bundle
from ..._core._checks import check_name
from ..._core._inbox import InboxReceiver, InboxSender, open_inbox
from ..._core._log import library_logger
from ..._core._lowlevel import ForwardingTaskStatus

logger = library_logger("trio_graceful.runner")

T = TypeVar("T")

if TYPE_CHECKING:
    from typing_extensions import Never

    StatusT_co = TypeVar("StatusT_co", covariant=True)
    A1 = TypeVar("A1", contravariant=True)
    A2 = TypeVar("A2", contravariant=True)
    A3 = TypeVar("A3", contravariant=True)

    # What `Runner.start_service` accepts, by the number of arguments after
    # the inbox, so that its result has the type the service passes to
    # ``task_status.started()``. (A variadic protocol would do for all, but
    # mypy does not solve one; more arguments go through functools.partial.)
    # The inbox carries nothing but STOP.

    class Service0(Protocol[StatusT_co]):
        def __call__(
            self,
            inbox: InboxReceiver[Never],
            /,
            *,
            task_status: trio.TaskStatus[StatusT_co],
        ) -> Awaitable[object]: ...

    class Service1(Protocol[A1, StatusT_co]):
        def __call__(
            self,
            inbox: InboxReceiver[Never],
            a1: A1,
            /,
            *,
            task_status: trio.TaskStatus[StatusT_co],
        ) -> Awaitable[object]: ...

    class Service2(Protocol[A1, A2, StatusT_co]):
        def __call__(
            self,
            inbox: InboxReceiver[Never],
            a1: A1,
            a2: A2,
            /,
            *,
            task_status: trio.TaskStatus[StatusT_co],
        ) -> Awaitable[object]: ...

    class Service3(Protocol[A1, A2, A3, StatusT_co]):
        def __call__(
            self,
            inbox: InboxReceiver[Never],
            a1: A1,
            a2: A2,
            a3: A3,
            /,
            *,
            task_status: trio.TaskStatus[StatusT_co],
        ) -> Awaitable[object]: ...


def _name_of(async_fn: Callable[..., object]) -> str:
    return str(getattr(async_fn, "__qualname__", None) or repr(async_fn))


@attrs.define(eq=False)
class _Entry:
    name: str
    sender: InboxSender[Any]
    done: trio.Event = attrs.field(factory=trio.Event)


async def _hold(
    inbox: InboxReceiver[Any],
    manager: AbstractAsyncContextManager[object],
    *,
    task_status: trio.TaskStatus[object],
) -> None:
    """The service behind a resource: enter it, report it, exit it at STOP."""
    async with manager as value:
        task_status.started(value)
        await inbox.receive()  # nothing but STOP is ever sent here


@final
class ServiceStack:
    """The ordered services of one run (see the module docstring).

    Args:
        bundle: The bundle the services run in; it must outlive every caller
            of `start`.
        on_failure: Called with a service's name and exception when a service
            that was ready raises an `Exception` or `SystemExit`; the
            exception goes no further.
    """

    def __init__(
        self, bundle: Bundle, on_failure: Callable[[str, BaseException], object]
    ) -> None:
        self._bundle = bundle
        self._on_failure = on_failure
        self._entries: list[_Entry] = []
        self._closed_reason: str | None = None

    @property
    def bundle(self) -> Bundle:
        """The bundle the services run in."""
        return self._bundle

    @property
    def names(self) -> list[str]:
        """The names of the services that became ready, in start order."""
        return [entry.name for entry in self._entries]

    @property
    def running(self) -> list[str]:
        """The names of the services that became ready and have not ended."""
        return [entry.name for entry in self._entries if not entry.done.is_set()]

    def close(self, reason: str) -> None:
        """Refuse further starts, giving ``reason`` in the error."""
        if self._closed_reason is None:
            self._closed_reason = reason

    async def start(
        self,
        async_fn: Callable[..., Awaitable[object]],
        args: tuple[object, ...],
        name: str | None,
    ) -> Any:
        """Start ``async_fn(inbox, *args, task_status=...)`` and wait until it is ready.

        Returns what the service passed to ``task_status.started()``.

        Raises:
            RuntimeError: if the stack is closed.
            Exception: whatever the service raised before it was ready.
        """
        check_name("name", name)
        if self._closed_reason is not None:
            raise RuntimeError(self._closed_reason)
        service = name if name is not None else _name_of(async_fn)
        sender: InboxSender[Any]
        inbox: InboxReceiver[Any]
        sender, inbox = open_inbox()
        entry = _Entry(service, sender)
        value = await self._bundle.start(
            self._run, entry, async_fn, inbox, args, name=service
        )
        self._entries.append(entry)
        logger.debug("service %r is ready", service)
        return value

    async def enter(
        self, manager: AbstractAsyncContextManager[T], name: str | None
    ) -> T:
        """Enter ``manager`` in a service of its own; return what it yields.

        Raises:
            TypeError: if ``manager`` is not an async context manager.
            RuntimeError: if the stack is closed.
            Exception: whatever entering ``manager`` raised.
        """
        if not (hasattr(manager, "__aenter__") and hasattr(manager, "__aexit__")):
            raise TypeError(
                f"enter_resource expected an async context manager, not {manager!r}"
            )
        if name is None:
            name = type(manager).__qualname__
        return cast("T", await self.start(_hold, (manager,), name))

    async def stop(self, deadline: float) -> None:
        """Stop every service in reverse start order, all by ``deadline`` (Trio time).

        Each service gets STOP only once the ones started after it have ended.
        At ``deadline`` the bundle hard-cancels the services still running,
        and `stop` returns once they have unwound. This is a checkpoint.
        """
        self.close("the program is shutting down; no new services can be started")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._stop_in_reverse_order)
            # Sets the hard deadline and reports on every service when they
            # have all ended.
            await self._bundle.cancel(max(0.0, deadline - trio.current_time()))

    async def _stop_in_reverse_order(self) -> None:
        for entry in reversed(self._entries):
            if entry.done.is_set():
                continue
            logger.debug("stopping service %r", entry.name)
            # A service that closed its inbox will not see STOP; the deadline
            # ends it.
            if entry.sender.statistics().open_receive_channels:
                entry.sender.stop()
            await entry.done.wait()

    async def _run(
        self,
        entry: _Entry,
        async_fn: Callable[..., Awaitable[object]],
        inbox: InboxReceiver[Any],
        args: tuple[object, ...],
        *,
        task_status: trio.TaskStatus[Any],
    ) -> None:
        status = ForwardingTaskStatus(task_status)
        try:
            await async_fn(inbox, *args, task_status=status)
        except (Exception, SystemExit) as exc:
            if not status.started_called:
                raise  # to the caller of start()
            self._on_failure(entry.name, exc)
        finally:
            entry.done.set()
