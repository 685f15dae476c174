"""Inboxes: Trio memory channels that can carry an in-band `STOP`.

An inbox is a memory channel with one more operation on its send side,
`InboxSender.stop`, which queues `STOP` behind every message already sent (or
already waiting to be sent) without ever blocking. Its receive side adds
`InboxReceiver.until_stop`, the stoppable idle point: it runs a cancel-safe
operation on an outside source (a socket, a WebSocket, a listener) and ends it
as soon as STOP is the next thing in the inbox, without losing what the source
produced.

The queue discipline follows `trio.open_memory_channel` exactly (the same
errors, the same checkpoints, the same FIFO hand-off); STOP rides in the same
FIFO as a sender that never waits.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Generic, TypeVar, final

import attrs
import trio
from outcome import Error, Value
from trio.lowlevel import Task

from ._paths import enclosing_bundle_path, task_path
from ._stop import STOP, StopType
from ._trace import TraceKind, emit, tracing
from ._util import NoPublicConstructor, check_buffer_size

if TYPE_CHECKING:
    from types import TracebackType

    from typing_extensions import Self, TypeVarTuple, Unpack

    PosArgT = TypeVarTuple("PosArgT")

T = TypeVar("T")
R = TypeVar("R")


@final
class _StopSender:
    """The pseudo-sender that carries STOP through the send queue: it never waits."""

    def __repr__(self) -> str:
        return "<STOP pseudo-sender>"


_STOP_SENDER = _StopSender()


@attrs.frozen
class InboxStatistics:
    """A snapshot of an inbox, returned by ``statistics()`` on either end."""

    current_buffer_used: int
    """Messages in the buffer now (a queued STOP takes no room)."""

    max_buffer_size: int | float
    """The buffer's capacity."""

    open_send_channels: int
    """Open `InboxSender` objects (clones included)."""

    open_receive_channels: int
    """Open `InboxReceiver` objects (clones included)."""

    tasks_waiting_send: int
    """Tasks blocked in `InboxSender.send`."""

    tasks_waiting_receive: int
    """Tasks blocked in `InboxReceiver.receive`."""

    peak_buffer_used: int
    """The most items the buffer has held at once."""

    stop_requested: bool
    """True once `InboxSender.stop` (or the owning bundle) asked for STOP."""

    stop_delivered: bool
    """True once STOP has been taken out of the queue by a receiver."""


@attrs.define(eq=False)
class _Endpoint:
    """Bookkeeping of one sender or receiver object (the state spans clones)."""

    # Tasks blocked on this object.
    tasks: set[Task] = attrs.field(factory=set[Task])
    closed: bool = False
    # Receivers only: STOP has been delivered to this object.
    stop_seen: bool = False


@attrs.define(eq=False)
class InboxState(Generic[T]):
    """The state shared by all the senders and receivers of one inbox."""

    max_buffer_size: int | float
    # The buffer. A queued STOP sits here too but takes no capacity.
    data: deque[T | StopType] = attrs.field(factory=deque[T | StopType])
    stop_in_data: bool = False
    open_send_channels: int = 0
    open_receive_channels: int = 0
    # FIFO of blocked senders, {task: (its sender, value)}. When stop() finds
    # senders waiting, STOP queues behind them under _STOP_SENDER, and moves
    # to the buffer as soon as it reaches the head (see settle()).
    send_tasks: OrderedDict[Task | _StopSender, tuple[_Endpoint, T | StopType]] = (
        attrs.field(
            factory=OrderedDict[Task | _StopSender, tuple[_Endpoint, T | StopType]]
        )
    )
    # FIFO of blocked receivers, {task: its receiver}
    receive_tasks: OrderedDict[Task, _Endpoint] = attrs.field(
        factory=OrderedDict[Task, _Endpoint]
    )
    peak_buffer_used: int = 0
    stop_requested: bool = False
    # STOP has left the queue: every receiver that has not seen it yet gets it
    # before anything else.
    stop_reached: bool = False
    # EndOfChannel has been delivered; a STOP requested after that is moot.
    ended: bool = False
    # Cancel scopes of tasks waiting in until_stop(), {scope: their receiver}
    watchers: dict[trio.CancelScope, _Endpoint] = attrs.field(
        factory=dict[trio.CancelScope, _Endpoint]
    )
    # Called with this state once the last receiver closes (a bundle forgets
    # the inbox). It must not hold the state itself: that would be a cycle.
    on_receivers_closed: Callable[[InboxState[T]], object] | None = None
    # The path of the bundle that opened the inbox, for trace events.
    owner: str | None = None

    def statistics(self) -> InboxStatistics:
        return InboxStatistics(
            current_buffer_used=self.buffer_used(),
            max_buffer_size=self.max_buffer_size,
            open_send_channels=self.open_send_channels,
            open_receive_channels=self.open_receive_channels,
            tasks_waiting_send=sum(
                1 for key in self.send_tasks if key is not _STOP_SENDER
            ),
            tasks_waiting_receive=len(self.receive_tasks),
            peak_buffer_used=self.peak_buffer_used,
            stop_requested=self.stop_requested,
            stop_delivered=self.stop_reached,
        )

    def buffer_used(self) -> int:
        return len(self.data) - self.stop_in_data

    def append(self, value: T | StopType) -> None:
        self.data.append(value)
        if value is STOP:
            self.stop_in_data = True
        self.peak_buffer_used = max(self.peak_buffer_used, self.buffer_used())

    def settle(self) -> None:
        """Move a STOP that has reached the head of the send queue to the buffer."""
        if next(iter(self.send_tasks), None) is _STOP_SENDER:
            del self.send_tasks[_STOP_SENDER]
            self.append(STOP)
            self.wake_watchers()

    def stop(self) -> None:
        """Queue STOP behind everything sent so far. Never blocks; idempotent."""
        if self.stop_requested:
            return
        self.stop_requested = True
        if tracing.active:
            self.trace(TraceKind.STOP_SENT, trio.lowlevel.current_task())
        if self.ended or not self.open_receive_channels:
            return
        if self.receive_tasks:
            # The queue is empty and receivers are parked: hand STOP to the
            # first waiting task of every receiver object.
            self.stop_reached = True
            for task, receiver in list(self.receive_tasks.items()):
                if not receiver.stop_seen:
                    receiver.stop_seen = True
                    receiver.tasks.remove(task)
                    del self.receive_tasks[task]
                    trio.lowlevel.reschedule(task, Value(STOP))
                    if tracing.active:
                        self.trace(TraceKind.STOP_RECEIVED, task)
        elif not self.send_tasks:
            self.append(STOP)
        else:
            self.send_tasks[_STOP_SENDER] = (_Endpoint(), STOP)
        self.wake_watchers()

    def stop_is_next(self, receiver: _Endpoint) -> bool:
        """True if ``receiver``'s next receive would return STOP."""
        if receiver.stop_seen or not self.stop_requested:
            return False
        return self.stop_reached or (bool(self.data) and self.data[0] is STOP)

    def trace(self, kind: TraceKind, task: Task) -> None:
        bundle = enclosing_bundle_path(task, bodies=False)
        if kind is TraceKind.STOP_SENT and self.owner is not None:
            bundle = self.owner
        emit(kind, bundle, task_path(task))

    def wake_watchers(self) -> None:
        for scope, receiver in list(self.watchers.items()):
            if self.stop_is_next(receiver):
                scope.cancel(reason="STOP is next in the inbox")


@final
@attrs.define(eq=False, repr=False, slots=False)
class InboxSender(trio.abc.SendChannel[T], metaclass=NoPublicConstructor):
    """The send side of an inbox: a `trio.MemorySendChannel` plus `stop`.

    Created by `open_inbox` and `Bundle.open_inbox`.
    """

    _state: InboxState[T]
    _me: _Endpoint = attrs.field(factory=_Endpoint, init=False)

    def __attrs_post_init__(self) -> None:
        self._state.open_send_channels += 1

    def __repr__(self) -> str:
        return f"<inbox sender at {id(self):#x}, using buffer at {id(self._state):#x}>"

    def statistics(self) -> InboxStatistics:
        """Return an `InboxStatistics` snapshot of the inbox."""
        return self._state.statistics()

    @trio.lowlevel.enable_ki_protection
    def send_nowait(self, value: T) -> None:
        """Send ``value`` without blocking.

        Raises:
            trio.WouldBlock: if the buffer is full.
            trio.ClosedResourceError: if this sender was closed.
            trio.BrokenResourceError: if every receiver was closed.
            ValueError: if ``value`` is `STOP`; use `stop` for that.
        """
        if value is STOP:
            raise ValueError("STOP cannot be sent as a message; call stop() instead")
        if self._me.closed:
            raise trio.ClosedResourceError
        state = self._state
        if state.open_receive_channels == 0:
            raise trio.BrokenResourceError
        if state.receive_tasks:
            assert not state.data
            task, receiver = state.receive_tasks.popitem(last=False)
            receiver.tasks.remove(task)
            trio.lowlevel.reschedule(task, Value(value))
        elif state.buffer_used() < state.max_buffer_size:
            state.append(value)
        else:
            raise trio.WouldBlock

    @trio.lowlevel.enable_ki_protection
    async def send(self, value: T) -> None:
        """Send ``value``, waiting for buffer space if the buffer is full.

        This is a checkpoint. Several tasks may send at once; their messages
        are delivered in the order they started waiting.

        Raises:
            trio.ClosedResourceError: if this sender was closed, also while waiting.
            trio.BrokenResourceError: if every receiver was closed.
            ValueError: if ``value`` is `STOP`; use `stop` for that.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self.send_nowait(value)
        except trio.WouldBlock:
            pass
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return

        task = trio.lowlevel.current_task()
        self._me.tasks.add(task)
        self._state.send_tasks[task] = (self._me, value)

        def abort_fn(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            self._me.tasks.remove(task)
            del self._state.send_tasks[task]
            self._state.settle()
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort_fn)

    @trio.lowlevel.enable_ki_protection
    def stop(self) -> None:
        """Queue `STOP` for the receivers, behind everything already sent.

        STOP is delivered after every message whose `send` completed, or was
        already waiting, when `stop` was called; messages sent later come
        after it. Each receiver object (each `InboxReceiver.clone`) gets STOP
        once. Calling `stop` again does nothing.

        This is not a checkpoint and never blocks, even when the buffer is
        full: STOP takes no room in the buffer, and when senders are waiting
        it queues behind them without waiting itself.

        Raises:
            trio.ClosedResourceError: if this sender was closed.
            trio.BrokenResourceError: if every receiver was closed.
        """
        if self._me.closed:
            raise trio.ClosedResourceError
        if self._state.open_receive_channels == 0:
            raise trio.BrokenResourceError
        self._state.stop()

    @trio.lowlevel.enable_ki_protection
    def clone(self) -> InboxSender[T]:
        """Return a new sender for the same inbox.

        Receivers see `trio.EndOfChannel` only when every clone is closed.

        Raises:
            trio.ClosedResourceError: if this sender was closed.
        """
        if self._me.closed:
            raise trio.ClosedResourceError
        return type(self)._create(self._state)  # pyright: ignore[reportPrivateUsage]

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @trio.lowlevel.enable_ki_protection
    def close(self) -> None:
        """Close this sender. Not a checkpoint; closing twice does nothing.

        Tasks blocked in `send` on this object get `trio.ClosedResourceError`.
        When the last sender closes, receivers get `trio.EndOfChannel` once
        the queue (including a queued STOP) is drained.
        """
        if self._me.closed:
            return
        self._me.closed = True
        state = self._state
        for task in self._me.tasks:
            trio.lowlevel.reschedule(task, Error(trio.ClosedResourceError()))
            del state.send_tasks[task]
        self._me.tasks.clear()
        state.settle()
        state.open_send_channels -= 1
        if state.open_send_channels == 0:
            assert not state.send_tasks
            if state.receive_tasks:
                state.ended = True
            for task, receiver in state.receive_tasks.items():
                receiver.tasks.remove(task)
                trio.lowlevel.reschedule(task, Error(trio.EndOfChannel()))
            state.receive_tasks.clear()

    @trio.lowlevel.enable_ki_protection
    async def aclose(self) -> None:
        """Close this sender; see `close`. This is a checkpoint."""
        self.close()
        await trio.lowlevel.checkpoint()


@final
@attrs.define(eq=False, repr=False, slots=False)
class InboxReceiver(
    trio.abc.ReceiveChannel[T | StopType], metaclass=NoPublicConstructor
):
    """The receive side of an inbox: a `trio.MemoryReceiveChannel` that yields `STOP`.

    `receive` returns STOP as an ordinary value. ``async for`` ends at STOP as
    well as at `trio.EndOfChannel`; `stop_received` tells which::

        async for request in inbox:
            await handle(request)
        if inbox.stop_received:
            ...  # asked to shut down: flush, say goodbye
        else:
            ...  # every sender closed

    A worker that keeps reading after STOP (to wait for a peer's goodbye,
    say) gets the messages sent after `InboxSender.stop`.
    """

    _state: InboxState[T]
    _me: _Endpoint

    def __attrs_post_init__(self) -> None:
        self._state.open_receive_channels += 1

    def __repr__(self) -> str:
        return (
            f"<inbox receiver at {id(self):#x}, using buffer at {id(self._state):#x}>"
        )

    @property
    def stop_received(self) -> bool:
        """True once this receiver (or the one it was cloned from) got `STOP`."""
        return self._me.stop_seen

    def statistics(self) -> InboxStatistics:
        """Return an `InboxStatistics` snapshot of the inbox."""
        return self._state.statistics()

    @trio.lowlevel.enable_ki_protection
    def receive_nowait(self) -> T | StopType:
        """Return the next message, or `STOP`, without blocking.

        Raises:
            trio.WouldBlock: if nothing is ready.
            trio.EndOfChannel: if every sender is closed and the queue is empty.
            trio.ClosedResourceError: if this receiver was closed.
        """
        me = self._me
        if me.closed:
            raise trio.ClosedResourceError
        state = self._state
        if state.stop_reached and not me.stop_seen:
            return self._take_stop()
        if state.data and state.data[0] is STOP:
            state.data.popleft()
            state.stop_in_data = False
            state.stop_reached = True
            state.wake_watchers()  # STOP is now next for every other receiver
            return self._take_stop()
        if state.send_tasks:
            # The buffer is full: let the first waiting sender in, as Trio does.
            waiter, (sender, value) = state.send_tasks.popitem(last=False)
            assert isinstance(waiter, Task)
            sender.tasks.remove(waiter)
            trio.lowlevel.reschedule(waiter)
            state.append(value)
            state.settle()
        if state.data:
            value = state.data.popleft()
            if state.watchers and state.stop_requested:
                state.wake_watchers()
            return value
        if not state.open_send_channels:
            state.ended = True
            raise trio.EndOfChannel
        raise trio.WouldBlock

    def _take_stop(self) -> StopType:
        self._me.stop_seen = True
        if tracing.active:
            self._state.trace(TraceKind.STOP_RECEIVED, trio.lowlevel.current_task())
        return STOP

    @trio.lowlevel.enable_ki_protection
    async def receive(self) -> T | StopType:
        """Return the next message, or `STOP`, waiting until there is one.

        This is a checkpoint. Several tasks may receive at once; the first to
        wait gets the first message.

        Raises:
            trio.EndOfChannel: if every sender is closed and the queue is empty.
            trio.ClosedResourceError: if this receiver was closed, also while
                waiting.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            value = self.receive_nowait()
        except trio.WouldBlock:
            pass
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return value

        task = trio.lowlevel.current_task()
        self._me.tasks.add(task)
        self._state.receive_tasks[task] = self._me

        def abort_fn(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            self._me.tasks.remove(task)
            del self._state.receive_tasks[task]
            return trio.lowlevel.Abort.SUCCEEDED

        received: T | StopType = await trio.lowlevel.wait_task_rescheduled(abort_fn)
        return received

    async def until_stop(
        self,
        async_fn: Callable[[Unpack[PosArgT]], Awaitable[R]],
        *args: Unpack[PosArgT],
    ) -> R | StopType:
        """Run ``await async_fn(*args)`` until it returns or STOP is next here.

        This is the stoppable idle point: wait on an outside source (a socket,
        a WebSocket, a listener) and give up the wait as soon as `STOP` is the
        next thing this receiver would return. Then STOP is taken from the
        inbox and returned. Messages queued before STOP are left alone: STOP is
        "next" only when they have been received.

        No message from the source is lost, provided ``async_fn`` is
        *cancel-safe*: when cancelled it either returns its result anyway or
        raises `trio.Cancelled` having consumed nothing. If it returns a
        result in the same instant STOP arrives, the result wins and STOP
        stays queued for the next call. These are cancel-safe:
        `trio.SocketStream.receive_some`, `trio.SocketListener.accept`,
        `trio.MemoryReceiveChannel.receive`, `InboxReceiver.receive`,
        trio-websocket's ``WebSocketConnection.get_message``, and
        `trio.serve_listeners` / `trio.serve_tcp` with a separate
        ``handler_nursery`` (cancelling them only stops accepting). Not
        cancel-safe: reads that assemble a message from several chunks
        (a half-read line is lost) and `trio.SSLStream` during its handshake.

        This is a checkpoint. ``async_fn``'s own exceptions propagate.

        Returns:
            What ``async_fn`` returned, or `STOP`.

        Raises:
            trio.ClosedResourceError: if this receiver was closed.
        """
        state, me = self._state, self._me
        while True:
            if me.closed:
                raise trio.ClosedResourceError
            if state.stop_is_next(me):
                await trio.lowlevel.checkpoint()
                if state.stop_is_next(me) and not me.closed:
                    taken = self.receive_nowait()
                    assert taken is STOP
                    return STOP
                continue
            with trio.CancelScope() as scope:
                state.watchers[scope] = me
                try:
                    return await async_fn(*args)
                finally:
                    del state.watchers[scope]
            # Only a watcher cancels the scope, when STOP is next or the
            # receiver closed; loop to take STOP (or to wait again if another
            # task sharing this receiver took it first).

    @trio.lowlevel.enable_ki_protection
    def clone(self) -> InboxReceiver[T]:
        """Return a new receiver for the same inbox.

        Messages are shared out between clones as in Trio; STOP is not: every
        clone gets its own STOP (a clone made after STOP was received starts
        with `stop_received` already true).

        Raises:
            trio.ClosedResourceError: if this receiver was closed.
        """
        if self._me.closed:
            raise trio.ClosedResourceError
        return type(self)._create(self._state, _Endpoint(stop_seen=self._me.stop_seen))  # pyright: ignore[reportPrivateUsage]

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T:
        """Return the next message; end the iteration at STOP or end-of-channel."""
        try:
            value = await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        if value is STOP:
            raise StopAsyncIteration
        return value

    @trio.lowlevel.enable_ki_protection
    def close(self) -> None:
        """Close this receiver. Not a checkpoint; closing twice does nothing.

        Tasks blocked in `receive` or `until_stop` on this object get
        `trio.ClosedResourceError`. When the last receiver closes, the queue
        is dropped and senders get `trio.BrokenResourceError`.
        """
        me = self._me
        if me.closed:
            return
        me.closed = True
        state = self._state
        for task in me.tasks:
            trio.lowlevel.reschedule(task, Error(trio.ClosedResourceError()))
            del state.receive_tasks[task]
        me.tasks.clear()
        for scope, receiver in list(state.watchers.items()):
            if receiver is me:
                scope.cancel(reason="the inbox receiver was closed")
        state.open_receive_channels -= 1
        if state.open_receive_channels == 0:
            assert not state.receive_tasks
            for waiter, (sender, _) in state.send_tasks.items():
                if isinstance(waiter, Task):
                    sender.tasks.remove(waiter)
                    trio.lowlevel.reschedule(waiter, Error(trio.BrokenResourceError()))
            state.send_tasks.clear()
            state.data.clear()
            if state.on_receivers_closed is not None:
                state.on_receivers_closed(state)
                state.on_receivers_closed = None

    @trio.lowlevel.enable_ki_protection
    async def aclose(self) -> None:
        """Close this receiver; see `close`. This is a checkpoint."""
        self.close()
        await trio.lowlevel.checkpoint()


def open_inbox_with_state(
    max_buffer_size: int | float,
) -> tuple[InboxSender[T], InboxReceiver[T], InboxState[T]]:
    """Open an inbox and also return its shared state (for `Bundle.open_inbox`)."""
    state = InboxState[T](check_buffer_size(max_buffer_size))
    sender = InboxSender[T]._create(state)  # pyright: ignore[reportPrivateUsage]
    receiver = InboxReceiver[T]._create(state, _Endpoint())  # pyright: ignore[reportPrivateUsage]
    return sender, receiver, state


# Written as a class, like trio.open_memory_channel, so that
# ``open_inbox[Request](0)`` fixes the message type.
@final
class open_inbox(tuple[InboxSender[T], InboxReceiver[T]]):
    """Open an inbox: a memory channel that can also carry `STOP`.

    It behaves like `trio.open_memory_channel` (same methods, errors and
    checkpoints), plus `InboxSender.stop` and `InboxReceiver.until_stop`. Use
    `Bundle.open_inbox` instead when a bundle should be able to stop it.

    Args:
        max_buffer_size (int or math.inf): How many messages the inbox holds
            before `InboxSender.send` blocks; 0 (the default) makes every send
            wait for a receiver.

    Returns:
        A pair ``(sender, receiver)``; write ``open_inbox[Msg](n)`` to give
        the message type.

    Raises:
        TypeError: if ``max_buffer_size`` is not an int or `math.inf`.
        ValueError: if ``max_buffer_size`` is negative.
    """

    def __new__(  # type: ignore[misc]
        cls, max_buffer_size: int | float = 0
    ) -> tuple[InboxSender[T], InboxReceiver[T]]:
        sender: InboxSender[T]
        receiver: InboxReceiver[T]
        state: InboxState[T]
        sender, receiver, state = open_inbox_with_state(max_buffer_size)
        del state
        return sender, receiver

    def __init__(self, max_buffer_size: int | float = 0) -> None: ...
