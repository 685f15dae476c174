"""The shared state of one inbox: its queues, and one function that moves STOP.

An inbox is a Trio memory channel (``trio/_channel.py``'s
``MemoryChannelState``) plus a `StopPosition`. The position changes only in
`InboxState.advance` (and in `InboxState.stop`, `InboxState.end` and
`InboxState.take_stop`, which apply one event each and then call it), always
through the table of `trio_graceful._core._stopposition`; whatever changed the queue
calls `advance`, which moves STOP forward as far as the queue now allows and
wakes the tasks that this concerns.

Where STOP is, in the queue:

* ``BEHIND_SENDERS``: a marker, `STOP_MARKER`, in `InboxState.send_tasks`
  behind the senders that were blocked when STOP was requested;
* ``IN_BUFFER``: the value `STOP` itself in `InboxState.data`; it takes no
  room (`InboxState.buffer_used` does not count it);
* ``REACHED``: nowhere; each receiver object remembers whether it has seen it.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Generic, TypeVar, cast, final

import attrs
import trio
from outcome import Value
from trio.lowlevel import Task

from ._paths import enclosing_bundle_path, task_path
from ._stop import STOP, StopType
from ._stopposition import REQUESTED, StopEvent, StopPosition, next_position
from ._trace import TraceKind, emit, tracing

T = TypeVar("T")

_P = StopPosition


@final
class _StopMarker:
    """STOP's place in the send queue: a pseudo-sender that never waits."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<STOP behind blocked senders>"


STOP_MARKER = _StopMarker()


@final
class Endpoint:
    """The bookkeeping of one sender or receiver object (clones have their own)."""

    __slots__ = ("closed", "stop_seen", "tasks")

    def __init__(self, *, stop_seen: bool = False) -> None:
        # Tasks blocked on this object, woken when it closes.
        self.tasks: set[Task] = set()
        self.closed = False
        # Receivers only: this object has returned STOP.
        self.stop_seen = stop_seen


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
class InboxState(Generic[T]):
    """The state shared by all the senders and receivers of one inbox.

    `Bundle.open_inbox` uses `stop`, `owner` and `on_receivers_closed`.
    """

    max_buffer_size: int | float
    # STOP jumps the queue (open_inbox(stop_first=True)).
    stop_first: bool = False
    # The buffer. A STOP in the buffer sits here too but takes no room.
    data: deque[T | StopType] = attrs.field(factory=deque[T | StopType])
    open_send_channels: int = 0
    open_receive_channels: int = 0
    # FIFO of blocked senders, {task: (its sender, value)}, and STOP_MARKER.
    send_tasks: OrderedDict[Task | _StopMarker, tuple[Endpoint, T]] = attrs.field(
        factory=OrderedDict[Task | _StopMarker, tuple[Endpoint, T]]
    )
    # FIFO of blocked receivers, {task: its receiver}
    receive_tasks: OrderedDict[Task, Endpoint] = attrs.field(
        factory=OrderedDict[Task, Endpoint]
    )
    peak_buffer_used: int = 0
    position: StopPosition = StopPosition.NONE
    # Cancel scopes of tasks waiting in until_stop(), {scope: their receiver};
    # made by the first such wait.
    watchers: dict[trio.CancelScope, Endpoint] | None = None
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
            tasks_waiting_send=len(self.send_tasks)
            - (self.position is _P.BEHIND_SENDERS),
            tasks_waiting_receive=len(self.receive_tasks),
            peak_buffer_used=self.peak_buffer_used,
            stop_requested=self.position in REQUESTED,
            stop_delivered=self.position is _P.REACHED,
        )

    def buffer_used(self) -> int:
        return len(self.data) - (self.position is _P.IN_BUFFER)

    def append(self, value: T) -> None:
        """Put a message in the buffer (Trio's ``send_nowait`` buffer branch)."""
        self.data.append(value)
        used = self.buffer_used()
        if used > self.peak_buffer_used:
            self.peak_buffer_used = used

    def stop(self) -> None:
        """Queue STOP (or, with ``stop_first``, deliver it at once). Idempotent.

        Never blocks. A STOP requested after the inbox ended is moot.
        """
        position = self.position
        if position is not _P.NONE and position is not _P.ENDED:
            return
        if tracing.active:
            self.trace(TraceKind.STOP_SENT, trio.lowlevel.current_task())
        if position is _P.NONE and (self.stop_first or self.receive_tasks):
            # Ahead of the queue; also where STOP lands when receivers wait,
            # since the queue is then empty.
            self.apply(StopEvent.REQUEST_FIRST)
            self._reached()
            return
        self.apply(StopEvent.REQUEST)
        if self.send_tasks:
            self.send_tasks[STOP_MARKER] = cast("tuple[Endpoint, T]", _MARKER_ENTRY)
        self.advance()

    def take_stop(self) -> None:
        """A receiver takes the STOP at the head of the buffer."""
        self.data.popleft()
        self.apply(StopEvent.REACH)
        self._reached()

    def end(self) -> None:
        """The inbox ended: end-of-channel was delivered, or every receiver closed."""
        self.apply(StopEvent.END)

    def apply(self, event: StopEvent) -> None:
        """Move STOP by ``event``, as the table says; the only writer of `position`.

        Raises:
            StopPositionError: if the table does not allow ``event`` now;
                nothing changes then.
        """
        self.position = next_position(self.position, event)

    def advance(self) -> None:
        """Move STOP as far forward as the queue allows; wake whom it concerns.

        Called after every change to the queue, by whatever changed it.
        """
        position = self.position
        if position is _P.NONE:
            return
        if position is _P.BEHIND_SENDERS:
            if self.send_tasks and next(iter(self.send_tasks)) is not STOP_MARKER:
                return  # the senders ahead of STOP have not all gone
            self.send_tasks.pop(STOP_MARKER, None)
            self.apply(StopEvent.PASS_SENDERS)
            self.data.append(STOP)
        elif position is _P.IN_BUFFER and self.receive_tasks:
            # Receivers wait, so the buffer holds nothing but STOP.
            self.data.popleft()
            self.apply(StopEvent.REACH)
            self._reached()
            return
        if self.watchers:
            self.wake_watchers()

    def _reached(self) -> None:
        """STOP has just been reached: the waiting receivers and watchers get it."""
        if self.receive_tasks:
            self._hand_stop_to_waiting_receivers()
        if self.watchers:
            self.wake_watchers()

    def _hand_stop_to_waiting_receivers(self) -> None:
        # The first waiting task of each receiver object that has not seen
        # STOP gets it; the other tasks keep waiting for messages.
        for task, receiver in list(self.receive_tasks.items()):
            if not receiver.stop_seen:
                receiver.stop_seen = True
                receiver.tasks.remove(task)
                del self.receive_tasks[task]
                trio.lowlevel.reschedule(task, Value(STOP))
                if tracing.active:
                    self.trace(TraceKind.STOP_RECEIVED, task)

    def stop_is_next(self, receiver: Endpoint) -> bool:
        """True if ``receiver``'s next receive would return STOP."""
        position = self.position
        if position is _P.REACHED:
            return not receiver.stop_seen
        return position is _P.IN_BUFFER and self.data[0] is STOP

    def wake_watchers(self) -> None:
        assert self.watchers is not None
        for scope, receiver in list(self.watchers.items()):
            if self.stop_is_next(receiver):
                scope.cancel(reason="STOP is next in the inbox")

    def trace(self, kind: TraceKind, task: Task) -> None:
        bundle = enclosing_bundle_path(task, bodies=False)
        if kind is TraceKind.STOP_SENT and self.owner is not None:
            bundle = self.owner
        emit(kind, bundle, task_path(task))


_MARKER_ENTRY: tuple[Endpoint, object] = (Endpoint(), STOP)
