"""The receive side of an inbox: `InboxReceiver`, with STOP and its idle points.

Like ``trio.MemoryReceiveChannel`` (see the map in `trio_graceful._core._inbox`),
plus what a worker needs around `STOP`: `InboxReceiver.until_stop` (wait on an
outside source until STOP is next), `InboxReceiver.iter_until_stop` (loop over
a source channel that way) and `InboxReceiver.drain_nowait` (take what is
still queued).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, final

import attrs
import trio
from outcome import Error
from trio.lowlevel import Task

from ._inboxstate import Endpoint, InboxState, InboxStatistics
from ._lowlevel import NoPublicConstructor
from ._stop import STOP, StopType
from ._stopposition import StopPosition
from ._trace import TraceKind, tracing

if TYPE_CHECKING:
    from types import TracebackType

    from typing_extensions import Self, TypeVarTuple, Unpack

    PosArgT = TypeVarTuple("PosArgT")

T_co = TypeVar("T_co", covariant=True)
R = TypeVar("R")
U = TypeVar("U")

_NONE = StopPosition.NONE


@final
@attrs.define(eq=False, repr=False)
class InboxReceiver(
    trio.abc.ReceiveChannel[T_co | StopType], metaclass=NoPublicConstructor
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
    say) gets the messages sent after `InboxSender.stop`; `drain_nowait`
    takes all of those queued at once.
    """

    _state: InboxState[T_co]
    _me: Endpoint

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
    def receive_nowait(self) -> T_co | StopType:
        """Return the next message, or `STOP`, without blocking. Not a checkpoint.

        Raises:
            trio.WouldBlock: if nothing is ready.
            trio.EndOfChannel: if every sender is closed and the queue is empty.
            trio.ClosedResourceError: if this receiver was closed.
        """
        me = self._me
        if me.closed:
            raise trio.ClosedResourceError
        state = self._state
        position = state.position
        if position is not _NONE and state.stop_is_next(me):
            return self._take_stop()
        if state.send_tasks:
            # The buffer is full: let the first waiting sender in, as Trio does.
            waiter, (sender, value) = state.send_tasks.popitem(last=False)
            assert isinstance(waiter, Task)
            sender.tasks.remove(waiter)
            trio.lowlevel.reschedule(waiter)
            state.append(value)
            # Fall through
        if state.data:
            message = state.data.popleft()
            if position is not _NONE:
                state.advance()  # STOP may be next now
            return message
        if not state.open_send_channels:
            state.end()
            raise trio.EndOfChannel
        raise trio.WouldBlock

    def _take_stop(self) -> StopType:
        state = self._state
        self._me.stop_seen = True
        if state.position is StopPosition.IN_BUFFER:
            state.take_stop()
        if tracing.active:
            state.trace(TraceKind.STOP_RECEIVED, trio.lowlevel.current_task())
        return STOP

    @trio.lowlevel.enable_ki_protection
    async def receive(self) -> T_co | StopType:
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
        me, state = self._me, self._state
        me.tasks.add(task)
        state.receive_tasks[task] = me

        def abort_fn(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            me.tasks.remove(task)
            del state.receive_tasks[task]
            return trio.lowlevel.Abort.SUCCEEDED

        received: T_co | StopType = await trio.lowlevel.wait_task_rescheduled(abort_fn)
        return received

    @trio.lowlevel.enable_ki_protection
    def drain_nowait(self) -> list[T_co]:
        """Take every message queued now, up to STOP, without blocking.

        Returns the messages in the buffer and the values of the tasks blocked
        in `InboxSender.send` (whose sends then complete), in the order
        `receive` would have returned them, stopping before a STOP this
        receiver has not received yet. After STOP, that is everything still
        queued: a worker of an inbox opened with ``stop_first=True`` hands the
        list on (to a successor, back to a queue) so that nothing is lost.
        Not a checkpoint.

        Returns:
            list: The messages, possibly none.

        Raises:
            trio.ClosedResourceError: if this receiver was closed.
        """
        if self._me.closed:
            raise trio.ClosedResourceError
        state, me = self._state, self._me
        messages: list[T_co] = []
        while (state.data or state.send_tasks) and not state.stop_is_next(me):
            # not STOP, which is not next
            messages.append(cast("T_co", self.receive_nowait()))
        return messages

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
        raises `trio.Cancelled` having lost nothing (it consumed nothing, or
        handled all it consumed). A whole loop can be one idle point when
        each of its checkpoints is cancel-safe, and what it reads is handled
        with no checkpoint in between. If it returns a
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
            TypeError: if ``async_fn`` is not callable.
            trio.ClosedResourceError: if this receiver was closed.
        """
        if not callable(async_fn):
            raise TypeError(f"async_fn must be an async function, not {async_fn!r}")
        state, me = self._state, self._me
        checkpointed = False
        while True:
            if me.closed:
                raise trio.ClosedResourceError
            if state.stop_is_next(me):
                if checkpointed:
                    return self._take_stop()
                await trio.lowlevel.checkpoint()
                checkpointed = True
                continue  # look again: the checkpoint let others run
            watchers = state.watchers
            if watchers is None:
                watchers = state.watchers = {}
            with trio.CancelScope() as scope:
                watchers[scope] = me
                try:
                    return await async_fn(*args)
                finally:
                    del watchers[scope]
            # Only a watcher cancels the scope, when STOP is next or the
            # receiver closed, and the cancellation was a checkpoint; loop to
            # take STOP (or to wait again if another task sharing this
            # receiver took it first).
            checkpointed = True

    def iter_until_stop(self, source: trio.abc.ReceiveChannel[U]) -> AsyncIterator[U]:
        """Iterate over ``source`` until STOP is next here or ``source`` ends.

        The loop of a service that reads its input from a channel, such as
        `open_stdin_lines`: each step is ``until_stop(source.receive)``, so
        what the source delivered is never lost, and the iteration ends
        cleanly at `STOP` and at the source's `trio.EndOfChannel` alike;
        `stop_received` tells which::

            async for line in inbox.iter_until_stop(lines):
                await handle(line)
            if not inbox.stop_received:
                ...  # end of input

        Each step is a checkpoint. The source's other exceptions propagate.

        Raises:
            TypeError: if ``source`` has no ``receive`` method.
        """
        if not callable(getattr(source, "receive", None)):
            raise TypeError(f"source must be a receive channel, not {source!r}")
        return _UntilStop(self, source)

    @trio.lowlevel.enable_ki_protection
    def clone(self) -> InboxReceiver[T_co]:
        """Return a new receiver for the same inbox. Not a checkpoint.

        Messages are shared out between clones as in Trio; STOP is not: every
        clone gets its own STOP (a clone made after STOP was received starts
        with `stop_received` already true).

        Raises:
            trio.ClosedResourceError: if this receiver was closed.
        """
        if self._me.closed:
            raise trio.ClosedResourceError
        me = Endpoint(stop_seen=self._me.stop_seen)
        return type(self)._create(self._state, me)  # pyright: ignore[reportPrivateUsage]

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

    async def __anext__(self) -> T_co:
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
        if state.watchers:
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
            state.end()
            if state.on_receivers_closed is not None:
                state.on_receivers_closed(state)
                state.on_receivers_closed = None

    @trio.lowlevel.enable_ki_protection
    async def aclose(self) -> None:
        """Close this receiver; see `close`. This is a checkpoint."""
        self.close()
        await trio.lowlevel.checkpoint()


@final
@attrs.define(eq=False)
class _UntilStop(Generic[U]):
    """The async iterator returned by `InboxReceiver.iter_until_stop`."""

    _inbox: InboxReceiver[Any]
    _source: trio.abc.ReceiveChannel[U]

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> U:
        try:
            item = await self._inbox.until_stop(self._source.receive)
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        if item is STOP:
            raise StopAsyncIteration
        return item
