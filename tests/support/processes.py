"""Helpers for the tests that watch whole process trees: lines, children, states.

The PID 1 and kill-mode tests start programs that start programs, signal some
of them, and assert what each one saw. Everything here waits for a condition
with a generous bound (a busy machine only makes it slower), never for a
fixed time. `ProcessLog` is the same for a program a Trio test started: it
reads its log (stderr) as it comes, and a test waits for a line.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import IO, TypeVar

import attrs
import trio

PATIENCE = 60.0
"""Seconds to wait for something that takes milliseconds on an idle machine."""


class LineReader:
    """Reads the lines of a pipe in a thread, so that a test can wait for one."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            self.lines.put(line.decode().rstrip("\n"))
        self.lines.put(None)  # end of file

    def next(self) -> str:
        """Return the next line; fail if none comes in time, or the pipe closed."""
        line = self.lines.get(timeout=PATIENCE)
        assert line is not None, f"the pipe closed; lines so far: {self.seen}"
        self.seen.append(line)
        return line

    def until(self, prefix: str) -> str:
        """Return the first line that starts with ``prefix``, skipping others."""
        while not (line := self.next()).startswith(prefix):
            pass
        return line

    def rest(self) -> list[str]:
        """Return the lines until the end of the pipe."""
        self._thread.join(PATIENCE)
        assert not self._thread.is_alive(), "the pipe stayed open"
        rest: list[str] = []
        while (line := self.lines.get_nowait()) is not None:
            rest.append(line)
        self.seen.extend(rest)
        return rest


@contextlib.contextmanager
def running(
    argv: list[str], stdin: int = subprocess.DEVNULL
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``argv`` with its output and errors in pipes.

    A test that fails while the program still runs must not leave it (or
    what it started) behind: on the way out, whatever of the process tree is
    left gets SIGKILL, from the leaves up, before the pipes are closed. The
    first process of a PID namespace takes SIGKILL from outside, and its end
    ends the namespace.
    """
    with subprocess.Popen(
        argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as process:
        try:
            yield process
        finally:
            # Only while it is unreaped is its pid surely still its own.
            if process.poll() is None:
                for pid in reversed(tree_of(process.pid)):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                process.wait(PATIENCE)


def tree_of(pid: int) -> list[int]:
    """``pid`` and its descendants still running, parents before children."""
    tree = [pid]
    for member in tree:
        tree.extend(children_of(member))
    return tree


def stat_of(pid: int) -> tuple[str, int] | None:
    """The state letter and the parent pid of ``pid``; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name, in parentheses, may contain spaces and parentheses.
    state, ppid = text.rsplit(")", 1)[1].split()[:2]
    return state, int(ppid)


def children_of(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (zombies included), in increasing order."""
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = stat_of(int(entry))
            if stat is not None and stat[1] == pid:
                found.append(int(entry))
    return sorted(found)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Wait until ``condition()`` is true (checked every 10 ms)."""
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.01)


@attrs.define(eq=False)
class ProcessLog:
    """The log (stderr, a pipe) of a process started in a Trio test, line by line.

    Run `read_log` in a nursery; then `wait_for` a line.
    """

    process: trio.Process
    lines: list[str] = attrs.field(factory=list)
    ready: re.Match[str] | None = None
    """The line `open_logged_process` waited for."""
    _changed: trio.Event = attrs.field(factory=trio.Event)
    _log_ended: bool = False

    async def read_log(self) -> None:
        """Read the log until the process closes it."""
        assert self.process.stderr is not None
        buffer = b""
        async for chunk in self.process.stderr:
            *complete, buffer = (buffer + chunk).split(b"\n")
            self.lines.extend(line.decode() for line in complete)
            self._changed.set()
            self._changed = trio.Event()
        self._log_ended = True
        self._changed.set()

    async def wait_for(self, pattern: str, count: int = 1) -> list[re.Match[str]]:
        """Wait until ``count`` log lines match ``pattern``; return the matches."""
        with trio.fail_after(PATIENCE):
            while True:
                matches = [m for line in self.lines if (m := re.search(pattern, line))]
                if len(matches) >= count:
                    return matches
                assert not self._log_ended, f"{pattern!r} not logged:\n" + self.log()
                await self._changed.wait()

    def log(self) -> str:
        return "\n".join(self.lines)

    async def exit_status(self) -> int:
        """Wait for the process to exit and its log to be read to the end."""
        with trio.fail_after(PATIENCE):
            status = await self.process.wait()
            while not self._log_ended:
                await self._changed.wait()
        return status


L = TypeVar("L", bound=ProcessLog)


@contextlib.asynccontextmanager
async def open_logged_process(
    command: list[str], make_log: Callable[[trio.Process], L], *, ready: str
) -> AsyncIterator[L]:
    """Start ``command`` with its stderr in a pipe; yield ``make_log(process)``,
    reading it, once a line matches ``ready`` (kept as ``log.ready``).

    A process still running on the way out (a test failed) is killed.
    """
    process = await trio.lowlevel.open_process(command, stderr=subprocess.PIPE)
    try:
        async with trio.open_nursery() as nursery:
            log = make_log(process)
            nursery.start_soon(log.read_log)
            [log.ready] = await log.wait_for(ready)
            yield log
            if process.returncode is None:
                process.kill()
    finally:
        if process.returncode is None:
            process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()
            assert process.stderr is not None
            await process.stderr.aclose()


async def refused(port: int) -> bool:
    """Whether a new connection to ``port`` is refused."""
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        return True
    await stream.aclose()
    return False
