"""Lines from standard input, read without a thread and cancellably.

The usual way to read stdin from async code is a thread blocked in
``sys.stdin.readline()``. That thread cannot be cancelled, keeps the program
from exiting when stdin stays open, and, if the interpreter shuts down while
it holds the lock of ``sys.stdin``'s buffer, ends the process with *could not
acquire lock for <_io.BufferedReader name='<stdin>'> at interpreter
shutdown*. `StdinLines` avoids all three: it reads the file descriptor with
``os.read`` in the Trio thread, and only once Trio says the descriptor is
readable, so there is no thread and no Python-level lock, and the wait is an
ordinary Trio checkpoint that can be cancelled.

What "readable" means depends on what stdin is (checked once, with
``fstat``):

* a pipe, a FIFO, a socket or a terminal: waited for with
  `trio.lowlevel.wait_readable`; one ``os.read`` then returns what is there
  (or end-of-file) without blocking;
* a regular file, a block device or a character device that is not a
  terminal (``/dev/null``): the kernel cannot wait for those (epoll refuses
  them) and never makes a read of them wait, so they are read directly, with
  a checkpoint before each read.

The descriptor's flags are never changed. Putting it in non-blocking mode
would change it for every process that shares the open file description: a
terminal is shared with the shell, and the shell would find its input
non-blocking after we exit, or after an emergency exit that had no chance to
restore it. Waiting for readiness first makes non-blocking mode unnecessary;
if the descriptor already is non-blocking, a read that finds nothing just
waits again.

Cancellation loses nothing: the only wait happens before a read, and bytes
that were read stay in the reader's buffer until a complete line is taken.
"""

from __future__ import annotations

import os
import stat
from typing import Final, final

import trio

from .._core._checks import check_int
from .._core._lowlevel import NoPublicConstructor

_CHUNK: Final = 65536
# File descriptors are C ints.
_FD_LIMIT: Final = 2**31


@final
class StdinLines(trio.abc.ReceiveChannel[bytes], metaclass=NoPublicConstructor):
    r"""A channel of the lines read from stdin (or another inherited descriptor).

    Created by `open_stdin_lines`. Each line is returned as `bytes` with its
    ``b"\n"``; a last line without one is returned as it is. ``async for
    line in lines`` ends at end-of-file. Closing the channel does not close
    the descriptor.

    Do not also read ``sys.stdin``: its buffer would take lines this
    channel never sees.
    """

    def __init__(self, fd: int, pollable: bool) -> None:
        self._fd = fd
        self._pollable = pollable
        self._buffer = bytearray()
        self._searched = 0  # bytes of the buffer known to hold no newline
        self._eof = False
        self._closed = False
        self._receiving = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "at EOF" if self._eof else "open"
        return f"<trio_graceful.StdinLines fd={self._fd} {state}>"

    @property
    def fd(self) -> int:
        """The file descriptor read."""
        return self._fd

    async def receive(self) -> bytes:
        """Return the next line, waiting until a whole one has arrived.

        This is a checkpoint. If it is cancelled, the bytes already read stay
        buffered for the next call.

        Raises:
            trio.EndOfChannel: at end-of-file, once every line was returned.
            trio.BusyResourceError: if another task is already receiving.
            trio.ClosedResourceError: if the channel was closed, also while
                waiting.
            trio.BrokenResourceError: if reading the descriptor failed (the
                original `OSError` is the cause).
        """
        if self._closed:
            raise trio.ClosedResourceError("this StdinLines channel was closed")
        if self._receiving:
            raise trio.BusyResourceError(
                "another task is already receiving from this StdinLines channel"
            )
        self._receiving = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            while True:
                line = self._take_line()
                if line is not None:
                    await trio.lowlevel.cancel_shielded_checkpoint()
                    return line
                if self._eof:
                    await trio.lowlevel.cancel_shielded_checkpoint()
                    raise trio.EndOfChannel
                await self._read_some()
        finally:
            self._receiving = False

    def _take_line(self) -> bytes | None:
        end = self._buffer.find(b"\n", self._searched)
        if end < 0:
            if self._eof and self._buffer:
                end = len(self._buffer) - 1
            else:
                self._searched = len(self._buffer)
                return None
        line = bytes(self._buffer[: end + 1])
        del self._buffer[: end + 1]
        self._searched = 0
        return line

    async def _read_some(self) -> None:
        # The wait is the only cancel point; nothing has been read before it.
        if self._pollable:
            try:
                await trio.lowlevel.wait_readable(self._fd)
            except trio.ClosedResourceError:
                # aclose() woke us with notify_closing().
                raise trio.ClosedResourceError(
                    "this StdinLines channel was closed"
                ) from None
        else:
            await trio.lowlevel.checkpoint()
        if self._closed:
            raise trio.ClosedResourceError("this StdinLines channel was closed")
        try:
            data = os.read(self._fd, _CHUNK)
        except BlockingIOError:
            return  # a non-blocking descriptor whose data went to another reader
        except OSError as exc:
            raise trio.BrokenResourceError(
                f"reading file descriptor {self._fd} failed: {exc}"
            ) from exc
        if data:
            self._buffer += data
        else:
            self._eof = True

    async def aclose(self) -> None:
        """Close the channel, not the descriptor. This is a checkpoint.

        A task waiting in `receive` gets `trio.ClosedResourceError`.
        """
        if not self._closed:
            self._closed = True
            if self._receiving and self._pollable:
                trio.lowlevel.notify_closing(self._fd)
        await trio.lowlevel.checkpoint()


def open_stdin_lines(*, fd: int = 0) -> StdinLines:
    """Read lines from stdin without a thread; see `StdinLines`.

    Use it as ``async with trio_graceful.open_stdin_lines() as lines:``, then
    ``await lines.receive()`` or ``async for line in lines``. Safe to cancel
    (``await inbox.until_stop(lines.receive)`` stops waiting at STOP and loses
    no input), never keeps the program from exiting, and never holds the
    lock whose loss at interpreter shutdown ends a program with *could not
    acquire lock for <stdin>*. Works with stdin a pipe (open or closed), a
    file, a terminal or ``/dev/null``, and never changes the descriptor's
    flags.

    Args:
        fd (int): The file descriptor to read; 0 (stdin) by default. It is
            not closed when the channel is.

    Raises:
        TypeError: if ``fd`` is not an int.
        ValueError: if ``fd`` is negative or too large to be a descriptor.
        OSError: if ``fd`` is not an open file descriptor.
    """
    if check_int("fd", fd) < 0:
        raise ValueError(f"fd must be >= 0, not {fd!r}")
    if fd >= _FD_LIMIT:
        raise ValueError(f"fd must be < {_FD_LIMIT}, not {fd!r}")
    return StdinLines._create(fd, is_pollable(fd))  # pyright: ignore[reportPrivateUsage]


def is_pollable(fd: int) -> bool:
    """Whether Trio can wait for ``fd`` to be ready (see the module docstring).

    A pipe, a FIFO, a socket or a terminal can be waited for; a regular file,
    a block device or ``/dev/null`` never makes a read or write wait.

    Raises:
        OSError: if ``fd`` is not an open file descriptor.
    """
    mode = os.fstat(fd).st_mode
    return (
        stat.S_ISFIFO(mode)
        or stat.S_ISSOCK(mode)
        or (stat.S_ISCHR(mode) and os.isatty(fd))
    )
