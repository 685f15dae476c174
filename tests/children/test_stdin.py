"""open_stdin_lines on real descriptors: pipes, files, /dev/null and a pty.

The reader is given the descriptor to read (``fd=``) instead of the test
process's own stdin; everything else is what a program reading its stdin
gets. These use the real clock (real descriptors become readable in real
time), but never wait on it: ``wait_all_tasks_blocked`` tells when the
reader has taken what was written and waits again.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import termios
from collections.abc import Iterator

import pytest
import trio
import trio.testing

import trio_graceful
from trio_graceful import STOP, StdinLines, open_inbox, open_stdin_lines


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_end, write_end = os.pipe()
    yield read_end, write_end
    for fd in (read_end, write_end):
        with contextlib.suppress(OSError):  # the test closed it
            os.close(fd)


@pytest.fixture
def pty() -> Iterator[tuple[int, int]]:
    master, slave = os.openpty()
    yield master, slave
    for fd in (master, slave):
        with contextlib.suppress(OSError):
            os.close(fd)


async def test_lines_from_an_open_pipe(pipe):
    read_end, write_end = pipe
    async with open_stdin_lines(fd=read_end) as lines:
        os.write(write_end, b'{"id": 1}\n{"id"')
        assert await lines.receive() == b'{"id": 1}\n'
        os.write(write_end, b": 2}\n\n")
        assert await lines.receive() == b'{"id": 2}\n'
        assert await lines.receive() == b"\n"
        assert lines.fd == read_end


async def test_end_of_file_returns_the_last_partial_line_then_ends(pipe):
    read_end, write_end = pipe
    os.write(write_end, b"one\ntwo")
    os.close(write_end)
    async with open_stdin_lines(fd=read_end) as lines:
        assert [line async for line in lines] == [b"one\n", b"two"]
        with pytest.raises(trio.EndOfChannel):
            await lines.receive()


async def test_a_pipe_already_closed(pipe):
    read_end, write_end = pipe
    os.close(write_end)
    async with open_stdin_lines(fd=read_end) as lines:
        with pytest.raises(trio.EndOfChannel):
            await lines.receive()


async def test_a_regular_file_is_read_to_its_last_line():
    with tempfile.TemporaryFile() as file:
        file.write(b"a\n" * 50_000 + b"last\n")
        file.flush()
        file.seek(0)
        async with open_stdin_lines(fd=file.fileno()) as lines:
            received = [line async for line in lines]
    assert received == [b"a\n"] * 50_000 + [b"last\n"]


async def test_dev_null_ends_at_once():
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        async with open_stdin_lines(fd=fd) as lines:
            with pytest.raises(trio.EndOfChannel):
                await lines.receive()
    finally:
        os.close(fd)


async def test_a_cancelled_receive_loses_nothing(pipe):
    read_end, write_end = pipe
    async with open_stdin_lines(fd=read_end) as lines:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:

                async def write_half_then_cancel() -> None:
                    os.write(write_end, b"hel")
                    # The reader has taken the three bytes and waits again.
                    await trio.testing.wait_all_tasks_blocked()
                    scope.cancel()

                nursery.start_soon(write_half_then_cancel)
                await lines.receive()
        assert scope.cancelled_caught
        os.write(write_end, b"lo\n")
        assert await lines.receive() == b"hello\n"


async def test_until_stop_gives_up_at_stop_and_keeps_the_input(pipe):
    read_end, write_end = pipe
    send, inbox = open_inbox[str]()
    async with open_stdin_lines(fd=read_end) as lines:
        async with trio.open_nursery() as nursery:

            async def stop_midway() -> None:
                os.write(write_end, b"first\nsec")
                await trio.testing.wait_all_tasks_blocked()
                send.stop()

            nursery.start_soon(stop_midway)
            assert await inbox.until_stop(lines.receive) == b"first\n"
            assert await inbox.until_stop(lines.receive) is STOP
        os.write(write_end, b"ond\n")
        assert await lines.receive() == b"second\n"


async def test_receive_is_a_checkpoint_even_with_a_line_ready(pipe):
    read_end, write_end = pipe
    os.write(write_end, b"x\ny\n")
    async with open_stdin_lines(fd=read_end) as lines:
        assert await lines.receive() == b"x\n"
        with trio.testing.assert_checkpoints():
            assert await lines.receive() == b"y\n"
        with trio.CancelScope() as scope:
            scope.cancel()
            await lines.receive()  # raises Cancelled, taking nothing
        os.close(write_end)
        assert [line async for line in lines] == []


async def test_a_terminal_keeps_its_flags_and_modes(pty):
    master, slave = pty
    blocking = os.get_blocking(slave)
    modes = termios.tcgetattr(slave)
    async with open_stdin_lines(fd=slave) as lines, trio.open_nursery() as nursery:

        async def type_a_line() -> None:
            await trio.testing.wait_all_tasks_blocked()
            # While the reader waits, nothing has changed.
            assert os.get_blocking(slave) == blocking
            assert termios.tcgetattr(slave) == modes
            os.write(master, b"typed\n")

        nursery.start_soon(type_a_line)
        assert await lines.receive() == b"typed\n"
    assert os.get_blocking(slave) == blocking
    assert termios.tcgetattr(slave) == modes


async def test_a_terminal_hung_up_ends_the_input(pty):
    master, slave = pty
    os.close(master)
    async with open_stdin_lines(fd=slave) as lines:
        with pytest.raises(trio.EndOfChannel):
            await lines.receive()


async def test_a_failing_read_breaks_the_channel(pty):
    # Reading a pty's master once its slave is closed fails with EIO.
    master, slave = pty
    os.close(slave)
    async with open_stdin_lines(fd=master) as lines:
        with pytest.raises(
            trio.BrokenResourceError,
            match=rf"^reading file descriptor {master} failed: \[Errno 5\] ",
        ) as info:
            await lines.receive()
    assert isinstance(info.value.__cause__, OSError)


async def test_a_non_blocking_descriptor_shared_by_two_readers(pipe):
    # When two readers share a pipe, one may find nothing to read after
    # being told the pipe was readable; it must wait again, not fail.
    read_end, write_end = pipe
    os.set_blocking(read_end, False)
    other = os.dup(read_end)
    try:
        received: list[bytes] = []
        async with (
            open_stdin_lines(fd=read_end) as first,
            open_stdin_lines(fd=other) as second,
            trio.open_nursery() as nursery,
        ):
            for reader in (first, second):

                async def collect(reader: StdinLines = reader) -> None:
                    async for line in reader:
                        received.append(line)

                nursery.start_soon(collect)
            await trio.testing.wait_all_tasks_blocked()
            os.write(write_end, b"only one\n")
            await trio.testing.wait_all_tasks_blocked()
            assert received == [b"only one\n"]
            os.close(write_end)
        assert received == [b"only one\n"]
    finally:
        os.close(other)


async def test_one_receiver_at_a_time(pipe):
    read_end, _ = pipe
    async with open_stdin_lines(fd=read_end) as lines, trio.open_nursery() as nursery:
        nursery.start_soon(lines.receive)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(
            trio.BusyResourceError,
            match=r"^another task is already receiving from this StdinLines channel$",
        ):
            await lines.receive()
        nursery.cancel_scope.cancel()


async def test_closing_wakes_the_receiver_and_keeps_the_descriptor(pipe):
    read_end, write_end = pipe
    lines = open_stdin_lines(fd=read_end)
    async with trio.open_nursery() as nursery:

        async def receive() -> None:
            with pytest.raises(
                trio.ClosedResourceError,
                match=r"^this StdinLines channel was closed$",
            ):
                await lines.receive()

        nursery.start_soon(receive)
        await trio.testing.wait_all_tasks_blocked()
        await lines.aclose()
    await lines.aclose()  # twice is fine
    assert repr(lines) == f"<trio_graceful.StdinLines fd={read_end} closed>"
    with pytest.raises(trio.ClosedResourceError):
        await lines.receive()
    os.write(write_end, b"still open\n")
    assert os.read(read_end, 100) == b"still open\n"


def test_a_descriptor_that_is_not_a_valid_int_is_refused_naming_fd():
    with pytest.raises(TypeError, match=r"^fd must be an int, not '0'$"):
        open_stdin_lines(fd="0")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^fd must be an int, not True$"):
        open_stdin_lines(fd=True)
    with pytest.raises(ValueError, match=r"^fd must be < 2147483648, not 8589934592$"):
        open_stdin_lines(fd=2**33)
    with pytest.raises(ValueError, match=r"^fd must be >= 0, not -1$"):
        open_stdin_lines(fd=-1)
    read_end, write_end = os.pipe()
    os.close(read_end)
    os.close(write_end)
    with pytest.raises(OSError, match=r"Bad file descriptor"):
        open_stdin_lines(fd=read_end)
    with pytest.raises(
        TypeError, match=r"^trio_graceful.StdinLines has no public constructor$"
    ):
        trio_graceful.StdinLines(0, True)  # type: ignore[call-arg]
