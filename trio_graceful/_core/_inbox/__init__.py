"""Inboxes: Trio memory channels that can carry an in-band `STOP`.

An inbox is a memory channel with one more operation on its send side,
`InboxSender.stop`, which queues `STOP` behind every message already sent (or
already waiting to be sent) without ever blocking. Its receive side adds
`InboxReceiver.until_stop`, the stoppable idle point: it runs a cancel-safe
operation on an outside source (a socket, a WebSocket, a listener) and ends it
as soon as STOP is the next thing in the inbox, without losing what the source
produced; `InboxReceiver.iter_until_stop` loops over a source channel that
way, and `InboxReceiver.drain_nowait` hands back what is still queued.

This package owns an inbox whole, as Trio's ``_channel.py`` owns a memory
channel: ``_state.py`` holds the state shared by both ends (the queues, where
STOP is and the table of its moves) and every change to it; ``_sender.py``
and ``_receiver.py`` hold the two ends; `open_inbox`, here, makes both ends
over one state.

The queue discipline follows `trio.open_memory_channel` exactly (the same
errors, the same checkpoints, the same FIFO hand-off). Trio writes the
logic in the two ends and keeps its state as plain data; here the ends check
their own arguments and the logic that changes the queues is in
`InboxState`, so that STOP moves with every change to them.

Counterparts in Trio's ``trio/_channel.py`` (read against Trio 0.35), so that
upstream fixes can be ported; a method marked "+ STOP" adds to Trio's logic
only a move of the STOP position (or a check of it):

==========================================  ===================================
here                                        trio/_channel.py
==========================================  ===================================
open_inbox                                  open_memory_channel
InboxStatistics                             MemoryChannelStatistics
InboxState                                  MemoryChannelState
Endpoint                                    the ``_closed``/``_tasks``
                                            attributes of the two ends
InboxSender.send_nowait, and                MemorySendChannel.send_nowait
InboxState.send_nowait
InboxSender.send, and InboxState.           MemorySendChannel.send (+ STOP)
add_waiting_sender / remove_waiting_sender
InboxSender.clone, and                      MemorySendChannel.clone, and its
InboxState.add_sender                       ``__attrs_post_init__``
InboxSender.close / aclose, and             MemorySendChannel.close (+ STOP)
InboxState.close_sender
InboxReceiver.receive_nowait, and           MemoryReceiveChannel.receive_nowait
InboxState.receive_nowait / take_stop       (+ STOP)
InboxReceiver.receive, and InboxState.      MemoryReceiveChannel.receive
add_waiting_receiver /
remove_waiting_receiver
InboxReceiver.clone, and                    MemoryReceiveChannel.clone, and its
InboxState.add_receiver                     ``__attrs_post_init__`` (+ STOP)
InboxReceiver.close / aclose, and           MemoryReceiveChannel.close (+ STOP)
InboxState.close_receiver
InboxSender.stop, InboxState.stop,          (none: STOP only)
InboxReceiver.until_stop /
iter_until_stop / drain_nowait /
stop_received, InboxState.drain
==========================================  ===================================

Trio finds a blocked task's channel object through
``task.custom_sleep_data``; here the queues map each task to its `Endpoint`.
"""

from __future__ import annotations

from typing import TypeVar, cast, final

from .._checks import check_bool, check_buffer_size
from ._receiver import InboxReceiver as InboxReceiver
from ._sender import InboxSender as InboxSender
from ._shared import InboxState as InboxState, InboxStatistics as InboxStatistics

T = TypeVar("T")


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
    sends, receives = state.add_sender(), state.add_receiver()
    sender = cast("InboxSender[T]", InboxSender._create(state, sends))  # pyright: ignore[reportPrivateUsage]
    receiver = cast("InboxReceiver[T]", InboxReceiver._create(state, receives))  # pyright: ignore[reportPrivateUsage]
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
