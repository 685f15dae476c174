"""Shared pieces of the essay examples: a message socket and a timeline.

The essay examples talk over a simulated connection, built on
`trio.testing.memory_stream_pair`, and run on Trio's mock clock so that a
70-second story plays out in milliseconds with exact times. This module holds
what they share:

* `MessageSocket` frames newline-terminated text messages on a stream. Its
  `receive` is cancel-safe: bytes already read stay in its buffer, so it can
  be used with `trio_graceful.InboxReceiver.until_stop`.
* `Timeline` records ``(time, who, what)`` events and prints them in a
  stable order.
* `run_virtual` runs an example's ``main`` on the mock clock.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import attrs
import trio
import trio.testing

import trio_graceful

T = TypeVar("T")


@attrs.define(eq=False)
class MessageSocket:
    """Newline-framed text messages over a Trio stream."""

    stream: trio.abc.Stream
    _buffer: bytearray = attrs.field(factory=bytearray, init=False)

    async def send(self, message: str) -> None:
        """Send one message. A checkpoint."""
        await self.stream.send_all(message.encode() + b"\n")

    async def receive(self) -> str:
        """Return the next message. A checkpoint; cancel-safe.

        Raises:
            EOFError: if the peer closed the connection.
        """
        while b"\n" not in self._buffer:
            chunk = await self.stream.receive_some()
            if not chunk:
                raise EOFError("the peer closed the connection")
            self._buffer += chunk  # only after the read completed: no loss
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer[:] = rest
        return line.decode()


def socket_pair() -> tuple[MessageSocket, MessageSocket]:
    """Return two connected message sockets (server side, client side)."""
    left, right = trio.testing.memory_stream_pair()
    return MessageSocket(left), MessageSocket(right)


@attrs.define(eq=False)
class _Passes(trio.abc.Instrument):
    """Counts the scheduler's passes: Trio waits for I/O once before each."""

    count: int = 0

    def before_io_wait(self, timeout: float) -> None:
        self.count += 1


@attrs.define
class Timeline:
    """What happened when, in seconds since the example started.

    Tasks that are ready in the same pass of Trio's scheduler run in a random
    order, so two events of one instant may be recorded in either order. The
    timeline is printed in an order that does not depend on it: by time, then
    by the scheduler's pass (a task woken by another runs in a later pass, so
    a cause comes before its effect), then by who and what.
    """

    start: float = attrs.field(factory=trio.current_time)
    events: list[tuple[float, str, str]] = attrs.field(
        factory=list[tuple[float, str, str]]
    )
    passes: list[int] = attrs.field(factory=list[int])
    """The scheduler's pass of each event."""
    _counter: _Passes = attrs.field(factory=_Passes, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        trio.lowlevel.add_instrument(self._counter)

    def __call__(self, who: str, what: str) -> None:
        self.events.append((trio.current_time() - self.start, who, what))
        self.passes.append(self._counter.count)

    def lines(self) -> list[str]:
        """The printed lines, in an order that does not depend on the scheduler."""
        order = sorted(
            zip(self.passes, self.events, strict=True),
            key=lambda p: (p[1][0], p[0], p[1][1], p[1][2]),
        )
        return [f"{at:7.2f} s  {who:<8} {what}" for _, (at, who, what) in order]

    def print(self) -> None:
        for line in self.lines():
            print(line)


def describe(report: trio_graceful.CancelReport) -> str:
    """Say in a few words how each child of a cancelled bundle ended."""
    if not report.children:
        return "no children were left"
    ends = sorted(report.children, key=lambda c: (c.ended_at, c.name))
    return ", ".join(f"{c.name} {c.outcome.value}" for c in ends)


def run_virtual(main: Callable[[], Awaitable[Timeline]]) -> Timeline:
    """Run ``main`` on the mock clock, print its timeline and return it."""
    timeline = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    timeline.print()
    return timeline
