"""Inboxes: Trio memory channels that can carry an in-band `STOP`.

An inbox is a memory channel with one more operation on its send side,
`InboxSender.stop`, which queues `STOP` behind every message already sent (or
already waiting to be sent) without ever blocking. Its receive side adds
`InboxReceiver.until_stop`, the stoppable idle point: it runs a cancel-safe
operation on an outside source (a socket, a WebSocket, a listener) and ends it
as soon as STOP is the next thing in the inbox, without losing what the source
produced; `InboxReceiver.iter_until_stop` loops over a source channel that
way, and `InboxReceiver.drain_nowait` hands back what is still queued.

The queue discipline follows `trio.open_memory_channel` exactly (the same
errors, the same checkpoints, the same FIFO hand-off); where STOP is lives in
`trio_graceful._core._inboxstate` and its table in `trio_graceful._core._stopposition`.

Counterparts in Trio's ``trio/_channel.py`` (read against Trio 0.35), so that
upstream fixes can be ported; a method marked "+ STOP" adds to Trio's logic
only a call of ``InboxState.advance`` (or a check of the STOP position):

====================================  =====================================
here                                  trio/_channel.py
====================================  =====================================
open_inbox                            open_memory_channel
InboxStatistics                       MemoryChannelStatistics
InboxState (_inboxstate.py)           MemoryChannelState
Endpoint (_inboxstate.py)             the ``_closed``/``_tasks`` attributes
InboxSender.send_nowait               MemorySendChannel.send_nowait
InboxSender.send                      MemorySendChannel.send (+ STOP)
InboxSender.clone / close / aclose    MemorySendChannel.clone / close (+ STOP)
InboxReceiver.receive_nowait          MemoryReceiveChannel.receive_nowait (+ STOP)
InboxReceiver.receive                 MemoryReceiveChannel.receive
InboxReceiver.clone / close / aclose  MemoryReceiveChannel.clone / close (+ STOP)
InboxSender.stop, InboxReceiver.      (none: STOP only)
until_stop / iter_until_stop /
drain_nowait / stop_received
====================================  =====================================

Trio finds a blocked task's channel object through
``task.custom_sleep_data``; here the queues map each task to its `Endpoint`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar, cast, final

import attrs
import trio
from outcome import Error, Value

from ._checks import check_bool, check_buffer_size
from ._inboxreceiver import InboxReceiver as InboxReceiver
from ._inboxstate import (
    Endpoint,
    InboxState as InboxState,
    InboxStatistics as InboxStatistics,
)
from ._lowlevel import NoPublicConstructor
from ._stop import STOP

if TYPE_CHECKING:
    from types import TracebackType

    from typing_extensions import Self

T = TypeVar("T")


@final
@attrs.define(eq=False, repr=False)
class InboxSender(trio.abc.SendChannel[T], metaclass=NoPublicConstructor):
    """The send side of an inbox: a `trio.MemorySendChannel` plus `stop`.

    Created by `open_inbox` and `Bundle.open_inbox`.
    """

    _state: InboxState[T]
    _me: Endpoint = attrs.field(factory=Endpoint, init=False)

    def __attrs_post_init__(self) -> None:
        self._state.open_send_channels += 1

    def __repr__(self) -> str:
        return f"<inbox sender at {id(self):#x}, using buffer at {id(self._state):#x}>"

    def statistics(self) -> InboxStatistics:
        """Return an `InboxStatistics` snapshot of the inbox."""
        return self._state.statistics()

    @trio.lowlevel.enable_ki_protection
    def send_nowait(self, value: T) -> None:
        """Send ``value`` without blocking. Not a checkpoint.

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
        me, state = self._me, self._state
        me.tasks.add(task)
        state.send_tasks[task] = (me, value)

        def abort_fn(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            me.tasks.remove(task)
            del state.send_tasks[task]
            state.advance()  # STOP may have been behind this sender
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort_fn)

    @trio.lowlevel.enable_ki_protection
    def stop(self) -> None:
        """Queue `STOP` for the receivers, behind everything already sent.

        STOP is delivered after every message whose `send` completed, or was
        already waiting, when `stop` was called; messages sent later come
        after it. (For an inbox opened with ``stop_first=True``, STOP goes
        ahead of all of them instead.) Each receiver object (each
        `InboxReceiver.clone`) gets STOP once. Calling `stop` again does
        nothing.

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
        """Return a new sender for the same inbox. Not a checkpoint.

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
        me = self._me
        if me.closed:
            return
        me.closed = True
        state = self._state
        for task in me.tasks:
            trio.lowlevel.reschedule(task, Error(trio.ClosedResourceError()))
            del state.send_tasks[task]
        me.tasks.clear()
        state.advance()
        state.open_send_channels -= 1
        if state.open_send_channels == 0:
            assert not state.send_tasks
            if state.receive_tasks:
                state.end()
            for task, receiver in state.receive_tasks.items():
                receiver.tasks.remove(task)
                trio.lowlevel.reschedule(task, Error(trio.EndOfChannel()))
            state.receive_tasks.clear()

    @trio.lowlevel.enable_ki_protection
    async def aclose(self) -> None:
        """Close this sender; see `close`. This is a checkpoint."""
        self.close()
        await trio.lowlevel.checkpoint()


def open_inbox_with_state(
    max_buffer_size: int | float, *, stop_first: bool = False
) -> tuple[InboxSender[T], InboxReceiver[T], InboxState[T]]:
    """Open an inbox and also return its shared state (for `Bundle.open_inbox`).

    Raises:
        TypeError, ValueError: as `open_inbox` does.
    """
    state: InboxState[T] = InboxState(
        check_buffer_size("max_buffer_size", max_buffer_size),
        check_bool("stop_first", stop_first),
    )
    # (not InboxSender[T]._create: a generic alias costs a lookup per inbox)
    sender = cast("InboxSender[T]", InboxSender._create(state))  # pyright: ignore[reportPrivateUsage]
    receiver = cast("InboxReceiver[T]", InboxReceiver._create(state, Endpoint()))  # pyright: ignore[reportPrivateUsage]
    return sender, receiver, state


# Written as a class, like trio.open_memory_channel, so that
# ``open_inbox[Request](0)`` fixes the message type.
@final
class open_inbox(tuple[InboxSender[T], InboxReceiver[T]]):
    """Open an inbox: a memory channel that can also carry `STOP`.

    It behaves like `trio.open_memory_channel` (same methods, errors and
    checkpoints), plus `InboxSender.stop` and `InboxReceiver.until_stop`. Use
    `Bundle.open_inbox` instead when a bundle should be able to stop it.

    By default STOP waits behind the whole queue: a worker finishes what was
    sent before it. With ``stop_first=True`` it goes ahead of every queued
    message instead, for a service that would rather stop early: its next
    `InboxReceiver.receive` returns STOP, and `InboxReceiver.drain_nowait`
    then hands back what was still queued, including the values of blocked
    senders, so that the service can pass them on.

    Not a checkpoint.

    Args:
        max_buffer_size (int or math.inf): How many messages the inbox holds
            before `InboxSender.send` blocks; 0 (the default) makes every send
            wait for a receiver.
        stop_first (bool): Deliver STOP ahead of the queued messages instead
            of behind them. Keyword-only; False by default.

    Returns:
        A pair ``(sender, receiver)``; write ``open_inbox[Msg](n)`` to give
        the message type.

    Raises:
        TypeError: if ``max_buffer_size`` is not an int or `math.inf`, or
            ``stop_first`` is not a bool.
        ValueError: if ``max_buffer_size`` is negative.
    """

    def __new__(  # type: ignore[misc]
        cls, max_buffer_size: int | float = 0, *, stop_first: bool = False
    ) -> tuple[InboxSender[T], InboxReceiver[T]]:
        sender: InboxSender[T]
        receiver: InboxReceiver[T]
        state: InboxState[T]
        sender, receiver, state = open_inbox_with_state(
            max_buffer_size, stop_first=stop_first
        )
        del state
        return sender, receiver

    def __init__(
        self, max_buffer_size: int | float = 0, *, stop_first: bool = False
    ) -> None: ...
