"""Where an inbox's STOP is: one state, and the table of its transitions.

Everything that decides how STOP moves through an inbox lives in one table,
`TRANSITIONS`: ``(position, event) -> next position``. A pair that is not in
the table is an illegal transition: `StopPositionError` is raised and nothing
changes. The inbox (`trio_graceful._core._inboxstate.InboxState`) owns the single
`StopPosition` value and changes it only through that table; the tests of
every legal and every illegal transition are generated from it.

The rules the table encodes:

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
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from ._statetable import describe_sources, legal_sources as table_sources


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

INITIAL_POSITION: Final = StopPosition.NONE

REQUESTED: Final = frozenset({_P.BEHIND_SENDERS, _P.IN_BUFFER, _P.REACHED, _P.MOOT})
"""The positions in which STOP has been requested."""


def legal_sources(event: StopEvent) -> tuple[StopPosition, ...]:
    """The positions in which ``event`` is legal, in declaration order."""
    return table_sources(TRANSITIONS, StopPosition, event)


class StopPositionError(RuntimeError):
    """An event that the STOP position's table does not allow now.

    It means a bug in the inbox, never a misuse: the position is left as it
    was.
    """


def next_position(position: StopPosition, event: StopEvent) -> StopPosition:
    """Return the position ``event`` leads to from ``position``.

    Raises:
        StopPositionError: if the pair is not in `TRANSITIONS`.
    """
    target = TRANSITIONS.get((position, event))
    if target is None:
        legal = describe_sources(legal_sources(event))
        raise StopPositionError(
            f"STOP cannot {event.value} while {position.value}; that is legal "
            f"only while {legal}"
        )
    return target
