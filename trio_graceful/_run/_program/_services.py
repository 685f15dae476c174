"""Services and resources: started in order, stopped in reverse order.

A *service* is a task that starts, says it is ready (``task_status.started``)
and runs until `STOP` reaches its own inbox. A *resource* is an async context
manager; it is held open by a small service of its own, so that both kinds
share one ordered list and one stop sequence:

* ``start`` appends a service to the list and runs it until it is ready; if
  it raises before it is ready, the error goes to the caller (who decides
  whether that fails the program) and the service leaves the list.
* ``stop(deadline)`` sends STOP to the last service, waits for it to end,
  then the one before, and so on; at ``deadline`` the bundle hard-cancels
  whatever is left. One deadline bounds the whole sequence.

A service runs in the bundle from its first line, not under the caller of
``start`` as a child of `trio.Nursery.start` would: a service that is still
starting has begun to build what it stops gracefully (a worker process that
accepts already, say), so it takes the graceful path too. If the caller is
cancelled (the shutdown began during the startup), the service gets STOP at
once instead of a hard cancel, and stays in the list, which waits for it
until the deadline like any other; its value, if it becomes ready, is
dropped, and an error it raises then is a failure of the service.

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
from ..._core._startable import check_startable

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
    ready: bool = False
    value: object = None
    """What the service passed to ``task_status.started()``."""
    error: BaseException | None = None
    """What it raised before it was ready, for the caller of ``start``."""
    abandoned: bool = False
    """The caller of ``start`` was cancelled first: the service got STOP."""
    returned: bool = False
    """It returned without raising (ready or not)."""
    settled: trio.Event = attrs.field(factory=trio.Event)
    """Set when the service is ready or has ended."""
    done: trio.Event = attrs.field(factory=trio.Event)

    def stop(self) -> None:
        # A service that closed its inbox will not see STOP; the deadline
        # ends it.
        if self.sender.statistics().open_receive_channels:
            self.sender.stop()


@final
class _ServiceStatus(trio.TaskStatus[Any]):
    """The ``task_status`` of a service: hands its value to the caller of ``start``."""

    def __init__(self, entry: _Entry) -> None:
        self._entry = entry

    def started(self, value: Any = None) -> None:
        entry = self._entry
        if entry.ready:
            raise RuntimeError("called 'started' twice on the same task status")
        entry.ready = True
        entry.value = value
        entry.settled.set()
        logger.debug("service %r is ready", entry.name)


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
    def running(self) -> list[str]:
        """The names of the services that have not ended, in start order.

        A service still starting is running: it is stopped like the others.
        """
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

        Returns what the service passed to ``task_status.started()``. If
        this call is cancelled first, the service gets STOP, not a hard
        cancel, and is stopped as the module says. This is a checkpoint.

        Raises:
            RuntimeError: if the stack is closed, if the service returned
                without calling ``task_status.started()``, or if it was
                hard-cancelled before it was ready.
            Exception: whatever the service raised before it was ready.
        """
        check_name("name", name)
        check_startable(async_fn)
        if self._closed_reason is not None:
            raise RuntimeError(self._closed_reason)
        service = name if name is not None else _name_of(async_fn)
        sender: InboxSender[Any]
        inbox: InboxReceiver[Any]
        sender, inbox = open_inbox()
        entry = _Entry(service, sender)
        self._bundle.start_soon(self._run, entry, async_fn, inbox, args, name=service)
        self._entries.append(entry)
        waited = False
        try:
            await entry.settled.wait()
            waited = True
        finally:
            # Cancelled, even in the instant the service became ready: no
            # one holds it now, so it stops.
            if not waited:
                entry.abandoned = True
                logger.debug("service %r: its start was cancelled; STOP", service)
                entry.stop()
        if entry.ready:
            return entry.value
        self._entries.remove(entry)  # it ended before it was ready
        error, entry.error = entry.error, None
        if error is not None:
            raise error
        if entry.returned:
            raise RuntimeError(
                f"service {service!r} returned without calling task_status.started()"
            )
        raise RuntimeError(
            f"service {service!r} was hard-cancelled before it called "
            "task_status.started()"
        )

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
            entry.stop()
            await entry.done.wait()

    async def _run(
        self,
        entry: _Entry,
        async_fn: Callable[..., Awaitable[object]],
        inbox: InboxReceiver[Any],
        args: tuple[object, ...],
    ) -> None:
        try:
            await async_fn(inbox, *args, task_status=_ServiceStatus(entry))
        except (Exception, SystemExit) as exc:
            if entry.ready or entry.abandoned:
                self._on_failure(entry.name, exc)
            else:
                entry.error = exc  # to the caller of start()
        else:
            entry.returned = True
        finally:
            entry.done.set()
            entry.settled.set()
