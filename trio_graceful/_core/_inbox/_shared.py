"""The state machine of one inbox: its queues, where STOP is, and every change.

Everything that affects an inbox's state machine lives in this module, as
h11's ``_state.py`` has it for HTTP: Trio's memory-channel state (a buffer, a
FIFO of blocked senders, a FIFO of blocked receivers), the *STOP position*
with the table of its moves, and every operation that changes the queues.
Each of those operations fires the moves it makes possible (STOP passes the
senders it was queued behind, reaches the waiting receivers, ends the
`until_stop` waits it concerns) before it returns: a caller never has to ask
for them. The two ends (``_sender.py``, ``_receiver.py``) check their own
arguments and call one method here per operation.

The position changes only through `TABLE`: ``(position, event) -> next
position``. A pair that is not in the table is an illegal transition:
`IllegalTransitionError` is raised and nothing changes; it means a bug in
the inbox, never a misuse. The tests of every legal and every illegal
transition are generated from the table. Its rules:

* STOP is requested once. From ``none`` it is queued behind the senders that
  are blocked at that moment (``behind blocked senders``, possibly behind
  none), or it is ``reached`` at once: for an inbox opened with
  ``stop_first=True`` it jumps the whole queue, and when receivers are
  waiting the queue is empty, so ahead of it and behind it are the same.
* It moves forward only: behind the senders, then in the buffer, then
  reached, that is, taken by a receiver, after which every other receiver
  object gets its own STOP before any message.
* Once the inbox has ended (end-of-channel was delivered, or every receiver
  closed and the queue was dropped), a STOP that was not yet reached can never
  be delivered: it is ``moot``. A STOP already reached stays reached.

Where STOP is, in the queue:

* ``BEHIND_SENDERS``: a marker, ``_STOP_MARKER``, in `InboxState.send_tasks`
  behind the senders that were blocked when STOP was requested;
* ``IN_BUFFER``: the value `STOP` itself in `InboxState.data`; it takes no
  room (`InboxState.buffer_used` does not count it);
* ``REACHED``: nowhere; each receiver object remembers whether it has seen it.
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final, Generic, TypeVar, cast, final

import attrs
import trio
from outcome import Error, Value
from trio.lowlevel import Task

from .._paths import enclosing_bundle_path, task_path
from .._statetable import StateTable
from .._stop import STOP, StopType
from .._trace import TraceKind, emit, tracing

T = TypeVar("T")


class StopPosition(enum.Enum):
    """Where the STOP of one inbox is, in the order it moves.

    * ``NONE``: no STOP was requested, and one still can be delivered.
    * ``BEHIND_SENDERS``: requested while senders were blocked; it waits in
      the send queue behind them.
    * ``IN_BUFFER``: in the buffer, behind the messages sent before it.
    * ``REACHED``: a receiver took it; each receiver object that has not seen
      it yet gets it before anything else.
    * ``ENDED``: not requested, and it could no longer be delivered: the inbox
      ended (end-of-channel was delivered, or every receiver closed).
    * ``MOOT``: requested, but it can never be delivered for the same reason.
    """

    NONE = "none"
    BEHIND_SENDERS = "behind blocked senders"
    IN_BUFFER = "in the buffer"
    REACHED = "reached"
    ENDED = "ended"
    MOOT = "moot"

    # Members are singletons: hash them by identity, at C speed, since the
    # table is consulted on the hot path of a shutdown.
    __hash__ = object.__hash__


class StopEvent(enum.Enum):
    """What moves STOP: the labels of the table's edges."""

    REQUEST = "request"
    REQUEST_FIRST = "request ahead of the queue"
    PASS_SENDERS = "pass the blocked senders"
    REACH = "be taken by a receiver"
    END = "end"

    __hash__ = object.__hash__


_P = StopPosition
_E = StopEvent

TRANSITIONS: Final[Mapping[tuple[StopPosition, StopEvent], StopPosition]] = (
    MappingProxyType(
        {
            (_P.NONE, _E.REQUEST): _P.BEHIND_SENDERS,
            (_P.NONE, _E.REQUEST_FIRST): _P.REACHED,
            (_P.NONE, _E.END): _P.ENDED,
            (_P.BEHIND_SENDERS, _E.PASS_SENDERS): _P.IN_BUFFER,
            # Only the last receiver closing ends an inbox with STOP queued:
            # the queue, STOP included, is dropped.
            (_P.BEHIND_SENDERS, _E.END): _P.MOOT,
            (_P.IN_BUFFER, _E.REACH): _P.REACHED,
            (_P.IN_BUFFER, _E.END): _P.MOOT,
            # Receivers that have not seen a reached STOP still get it first.
            (_P.REACHED, _E.END): _P.REACHED,
            (_P.ENDED, _E.REQUEST): _P.MOOT,
            (_P.ENDED, _E.REQUEST_FIRST): _P.MOOT,
            (_P.ENDED, _E.END): _P.ENDED,
            (_P.MOOT, _E.END): _P.MOOT,
        }
    )
)
"""Every legal transition: ``(position, event) -> next position``."""

TABLE: Final = StateTable(TRANSITIONS, StopPosition)
"""The STOP position's machine; it raises `IllegalTransitionError`."""

INITIAL_POSITION: Final = StopPosition.NONE

REQUESTED: Final = frozenset({_P.BEHIND_SENDERS, _P.IN_BUFFER, _P.REACHED, _P.MOOT})
"""The positions in which STOP has been requested."""


@final
class _StopMarker:
    """STOP's place in the send queue: a pseudo-sender that never waits."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<STOP behind blocked senders>"


_STOP_MARKER = _StopMarker()


@final
class Endpoint:
    """The bookkeeping of one sender or receiver object (clones have their own)."""

    __slots__ = ("closed", "stop_seen", "tasks")

    def __init__(self) -> None:
        # Tasks blocked on this object, woken when it closes.
        self.tasks: set[Task] = set()
        self.closed = False
        # Receivers only: this object has returned STOP.
        self.stop_seen = False


_MARKER_ENTRY: tuple[Endpoint, object] = (Endpoint(), STOP)


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

    The ends read it, and change it only through its methods. None of them
    is a checkpoint. `Bundle.open_inbox` uses `stop`, `owner` and
    `on_receivers_closed`.
    """

    max_buffer_size: int | float
    # STOP jumps the queue (open_inbox(stop_first=True)).
    stop_first: bool = False
    # The buffer. A STOP in the buffer sits here too but takes no room.
    data: deque[T | StopType] = attrs.field(factory=deque[T | StopType])
    open_send_channels: int = 0
    open_receive_channels: int = 0
    # FIFO of blocked senders, {task: (its sender, value)}, and _STOP_MARKER.
    send_tasks: OrderedDict[Task | _StopMarker, tuple[Endpoint, T]] = attrs.field(
        factory=OrderedDict[Task | _StopMarker, tuple[Endpoint, T]]
    )
    # FIFO of blocked receivers, {task: its receiver}
    receive_tasks: OrderedDict[Task, Endpoint] = attrs.field(
        factory=OrderedDict[Task, Endpoint]
    )
    peak_buffer_used: int = 0
    position: StopPosition = INITIAL_POSITION
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

    def stop_is_next(self, receiver: Endpoint) -> bool:
        """True if ``receiver``'s next receive would return STOP."""
        position = self.position
        if position is _P.REACHED:
            return not receiver.stop_seen
        return position is _P.IN_BUFFER and self.data[0] is STOP

    # -- the send side ---------------------------------------------------------

    def add_sender(self) -> Endpoint:
        """A sender object opens (`open_inbox`, a clone): its bookkeeping."""
        self.open_send_channels += 1
        return Endpoint()

    def send_nowait(self, sender: Endpoint, value: T) -> None:
        """Hand ``value`` to a waiting receiver, or put it in the buffer.

        Raises:
            trio.WouldBlock: if the buffer is full.
            trio.ClosedResourceError: if ``sender`` was closed.
            trio.BrokenResourceError: if every receiver was closed.
        """
        if sender.closed:
            raise trio.ClosedResourceError
        if self.open_receive_channels == 0:
            raise trio.BrokenResourceError
        if self.receive_tasks:
            assert not self.data
            task, receiver = self.receive_tasks.popitem(last=False)
            receiver.tasks.remove(task)
            trio.lowlevel.reschedule(task, Value(value))
        elif self.buffer_used() < self.max_buffer_size:
            self._append(value)
        else:
            raise trio.WouldBlock

    def add_waiting_sender(self, task: Task, sender: Endpoint, value: T) -> None:
        """``task`` waits in ``sender.send(value)`` for room, at the queue's end."""
        sender.tasks.add(task)
        self.send_tasks[task] = (sender, value)

    def remove_waiting_sender(self, task: Task, sender: Endpoint) -> None:
        """``task`` gave up its send: it leaves the queue, and STOP may pass it."""
        sender.tasks.remove(task)
        del self.send_tasks[task]
        self._advance()

    def close_sender(self, sender: Endpoint) -> None:
        """Close ``sender``; its waiting tasks get `trio.ClosedResourceError`.

        When it is the last sender, the waiting receivers get
        `trio.EndOfChannel`. Closing twice does nothing.
        """
        if sender.closed:
            return
        sender.closed = True
        for task in sender.tasks:
            trio.lowlevel.reschedule(task, Error(trio.ClosedResourceError()))
            del self.send_tasks[task]
        sender.tasks.clear()
        self._advance()
        self.open_send_channels -= 1
        if self.open_send_channels == 0:
            assert not self.send_tasks
            if self.receive_tasks:
                self.apply(_E.END)
            for task, receiver in self.receive_tasks.items():
                receiver.tasks.remove(task)
                trio.lowlevel.reschedule(task, Error(trio.EndOfChannel()))
            self.receive_tasks.clear()

    def stop(self) -> None:
        """Queue STOP (or, with ``stop_first``, deliver it at once). Idempotent.

        Never blocks. A STOP requested after the inbox ended is moot.
        """
        position = self.position
        if position is not _P.NONE and position is not _P.ENDED:
            return
        if tracing.active:
            self._trace(TraceKind.STOP_SENT, trio.lowlevel.current_task())
        if position is _P.NONE and (self.stop_first or self.receive_tasks):
            # Ahead of the queue; also where STOP lands when receivers wait,
            # since the queue is then empty.
            self.apply(_E.REQUEST_FIRST)
            self._reached()
            return
        self.apply(_E.REQUEST)
        if self.send_tasks:
            self.send_tasks[_STOP_MARKER] = cast("tuple[Endpoint, T]", _MARKER_ENTRY)
        self._advance()

    # -- the receive side ------------------------------------------------------

    def add_receiver(self, *, stop_seen: bool = False) -> Endpoint:
        """A receiver object opens; a clone has seen STOP if its original has."""
        self.open_receive_channels += 1
        # (not Endpoint(stop_seen=...): calling a class with keywords costs
        # a dict per inbox)
        receiver = Endpoint()
        receiver.stop_seen = stop_seen
        return receiver

    def receive_nowait(self, receiver: Endpoint) -> T | StopType:
        """Take the next message, or STOP, for ``receiver``.

        Raises:
            trio.WouldBlock: if nothing is ready.
            trio.EndOfChannel: if every sender is closed and the queue is empty.
            trio.ClosedResourceError: if ``receiver`` was closed.
        """
        if receiver.closed:
            raise trio.ClosedResourceError
        position = self.position
        if position is not _P.NONE and self.stop_is_next(receiver):
            return self.take_stop(receiver)
        if self.send_tasks:
            # The buffer is full: let the first waiting sender in, as Trio does.
            waiter, (sender, value) = self.send_tasks.popitem(last=False)
            assert isinstance(waiter, Task)
            sender.tasks.remove(waiter)
            trio.lowlevel.reschedule(waiter)
            self._append(value)
            # Fall through
        if self.data:
            message = self.data.popleft()
            if position is not _P.NONE:
                self._advance()  # STOP may be next now
            return message
        if not self.open_send_channels:
            self.apply(_E.END)
            raise trio.EndOfChannel
        raise trio.WouldBlock

    def take_stop(self, receiver: Endpoint) -> StopType:
        """``receiver`` takes the STOP that is next for it; return STOP."""
        receiver.stop_seen = True
        if self.position is _P.IN_BUFFER:
            self.data.popleft()
            self.apply(_E.REACH)
            self._reached()
        if tracing.active:
            self._trace(TraceKind.STOP_RECEIVED, trio.lowlevel.current_task())
        return STOP

    def drain(self, receiver: Endpoint) -> list[T]:
        """Take every message queued now for ``receiver``, up to STOP.

        Raises:
            trio.ClosedResourceError: if ``receiver`` was closed.
        """
        if receiver.closed:
            raise trio.ClosedResourceError
        messages: list[T] = []
        while (self.data or self.send_tasks) and not self.stop_is_next(receiver):
            # not STOP, which is not next
            messages.append(cast("T", self.receive_nowait(receiver)))
        return messages

    def add_waiting_receiver(self, task: Task, receiver: Endpoint) -> None:
        """``task`` waits in ``receiver.receive()``, at the queue's end."""
        receiver.tasks.add(task)
        self.receive_tasks[task] = receiver

    def remove_waiting_receiver(self, task: Task, receiver: Endpoint) -> None:
        """``task`` gave up its receive."""
        receiver.tasks.remove(task)
        del self.receive_tasks[task]

    def close_receiver(self, receiver: Endpoint) -> None:
        """Close ``receiver``; its waits end with `trio.ClosedResourceError`.

        When it is the last receiver, the queue (STOP included) is dropped,
        the waiting senders get `trio.BrokenResourceError`, and
        `on_receivers_closed` is called. Closing twice does nothing.
        """
        if receiver.closed:
            return
        receiver.closed = True
        for task in receiver.tasks:
            trio.lowlevel.reschedule(task, Error(trio.ClosedResourceError()))
            del self.receive_tasks[task]
        receiver.tasks.clear()
        if self.watchers:
            for scope, watching in list(self.watchers.items()):
                if watching is receiver:
                    scope.cancel(reason="the inbox receiver was closed")
        self.open_receive_channels -= 1
        if self.open_receive_channels == 0:
            assert not self.receive_tasks
            for waiter, (sender, _) in self.send_tasks.items():
                if isinstance(waiter, Task):
                    sender.tasks.remove(waiter)
                    trio.lowlevel.reschedule(waiter, Error(trio.BrokenResourceError()))
            self.send_tasks.clear()
            self.data.clear()
            self.apply(_E.END)
            if self.on_receivers_closed is not None:
                self.on_receivers_closed(self)
                self.on_receivers_closed = None

    # -- the machine -----------------------------------------------------------

    def apply(self, event: StopEvent) -> None:
        """Move STOP by ``event``, as `TABLE` says; the only writer of `position`.

        Raises:
            IllegalTransitionError: if the table does not allow ``event`` now;
                nothing changes then.
        """
        self.position = TABLE.move(self.position, event, subject="STOP")

    def _append(self, value: T) -> None:
        # Trio's send_nowait buffer branch, and the peak it reached.
        self.data.append(value)
        used = self.buffer_used()
        if used > self.peak_buffer_used:
            self.peak_buffer_used = used

    def _advance(self) -> None:
        """Move STOP as far forward as the queue allows; wake whom it concerns.

        Called by every method above that changed the queue, once it has.
        """
        position = self.position
        if position is _P.NONE:
            return
        if position is _P.BEHIND_SENDERS:
            if self.send_tasks and next(iter(self.send_tasks)) is not _STOP_MARKER:
                return  # the senders ahead of STOP have not all gone
            self.send_tasks.pop(_STOP_MARKER, None)
            self.apply(_E.PASS_SENDERS)
            self.data.append(STOP)
        elif position is _P.IN_BUFFER and self.receive_tasks:
            # Receivers wait, so the buffer holds nothing but STOP.
            self.data.popleft()
            self.apply(_E.REACH)
            self._reached()
            return
        if self.watchers:
            self._wake_watchers()

    def _reached(self) -> None:
        """STOP has just been reached: the waiting receivers and watchers get it."""
        if self.receive_tasks:
            self._hand_stop_to_waiting_receivers()
        if self.watchers:
            self._wake_watchers()

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
                    self._trace(TraceKind.STOP_RECEIVED, task)

    def _wake_watchers(self) -> None:
        assert self.watchers is not None
        for scope, receiver in list(self.watchers.items()):
            if self.stop_is_next(receiver):
                scope.cancel(reason="STOP is next in the inbox")

    def _trace(self, kind: TraceKind, task: Task) -> None:
        bundle = enclosing_bundle_path(task, bodies=False)
        if kind is TraceKind.STOP_SENT and self.owner is not None:
            bundle = self.owner
        emit(kind, bundle, task_path(task))
