"""The send side of an inbox: `InboxSender`, a memory channel's sender plus `stop`.

Like ``trio.MemorySendChannel`` (see the map in the package's docstring):
each operation checks its arguments and makes one change to the
`InboxState`, which moves STOP as that change allows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar, final

import attrs
import trio

from .._lowlevel import NoPublicConstructor
from .._stop import STOP
from ._shared import Endpoint, InboxState, InboxStatistics

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
    _me: Endpoint

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
        self._state.send_nowait(self._me, value)

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
        state.add_waiting_sender(task, me, value)

        def abort_fn(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            state.remove_waiting_sender(task, me)
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
        return type(self)._create(self._state, self._state.add_sender())  # pyright: ignore[reportPrivateUsage]

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
        self._state.close_sender(self._me)

    @trio.lowlevel.enable_ki_protection
    async def aclose(self) -> None:
        """Close this sender; see `close`. This is a checkpoint."""
        self.close()
        await trio.lowlevel.checkpoint()
