"""The STOP message: the in-band request to shut down gracefully."""

from __future__ import annotations

import enum
from typing import Final, Literal


class StopType(enum.Enum):
    """The type of `STOP`, for annotations such as ``Request | StopType``.

    It has exactly one member, so type checkers narrow on ``msg is STOP``::

        msg = await inbox.receive()  # Request | StopType
        if msg is STOP:
            return  # msg: StopType here
        handle(msg)  # msg: Request here
    """

    STOP = "STOP"

    def __repr__(self) -> str:
        return "trio_graceful.STOP"

    def __str__(self) -> str:
        return "STOP"

    def __bool__(self) -> Literal[True]:
        return True


STOP: Final = StopType.STOP
"""The message that asks a task to finish its work and shut down gracefully.

`STOP` travels in band: an inbox delivers it after every message that was
sent before it, so a worker meets it only where its own code asks for the
next message, that is, where its business logic is consistent. Compare it
with ``is``.
"""
