"""Whole lines to stdout, written without a thread and without ever blocking.

A server's answers go to a pipe its client reads. A client that stops
reading fills the pipe, and a plain blocking ``write`` then waits for ever:
in a thread (the SDK's transport) that thread cannot be stopped, and in the
Trio thread nothing else runs. `LineWriter` waits instead, cancellably, the
way `trio_graceful.StdinLines` waits to read: Trio reports the descriptor
writable, then one ``os.write`` of at most ``PIPE_BUF`` bytes goes out. A
pipe that is writable has room for that much, so the write returns at once,
and the descriptor can stay in blocking mode (its flags are shared with
every process that holds the same pipe, and are never changed). A regular
file or ``/dev/null`` never makes a write wait; those are written directly.

Lines are written whole or not at all: concurrent writers queue for a lock,
and a line cut short by a cancellation (a client that stopped reading, at the
hard cancel) breaks the writer, since the next line would be garbage to the
client.
"""

from __future__ import annotations

import os
import select
from typing import Final, final

import attrs
import trio

from .._children._stdin import is_pollable

# The most one write may carry and still never wait on a writable pipe.
_CHUNK: Final = select.PIPE_BUF


@final
@attrs.define(eq=False)
class LineWriter:
    """Writes lines to a file descriptor (stdout's wire copy) from Trio tasks."""

    fd: int
    _pollable: bool = attrs.field(init=False)
    _lock: trio.StrictFIFOLock = attrs.field(factory=trio.StrictFIFOLock, init=False)
    # Why writing is no longer possible, once it is not.
    _broken: str | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self._pollable = is_pollable(self.fd)

    @property
    def broken(self) -> bool:
        """True once a write failed or a line was cut short."""
        return self._broken is not None

    async def write_line(self, line: bytes) -> None:
        """Write ``line`` (which ends with a newline) in full, after earlier lines.

        This is a checkpoint; it waits while the reader lets the pipe fill up.
        If it is cancelled after part of the line went out, the writer is
        broken for good.

        Raises:
            trio.BrokenResourceError: if the writer is broken, or the write
                failed (the reader closed its end: ``EPIPE``).
        """
        async with self._lock:
            if self._broken is not None:
                raise trio.BrokenResourceError(self._broken)
            view = memoryview(line)
            written = 0
            try:
                while written < len(view):
                    if self._pollable:
                        await trio.lowlevel.wait_writable(self.fd)
                    else:
                        await trio.lowlevel.checkpoint()
                    try:
                        written += os.write(self.fd, view[written : written + _CHUNK])
                    except BlockingIOError:
                        continue  # a non-blocking descriptor someone else filled
                    except OSError as exc:
                        self._broken = (
                            f"writing file descriptor {self.fd} failed: {exc}"
                        )
                        raise trio.BrokenResourceError(self._broken) from exc
            except trio.Cancelled:
                if written:
                    self._broken = "a line was cut short by a cancellation"
                raise
