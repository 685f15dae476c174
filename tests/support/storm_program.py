"""A tiny `trio_graceful.run` program for signal storms, forked on request.

Starting a Python process that imports trio_graceful costs a third of a
second of CPU; hundreds of storms would spend most of their time there. So
this script imports it once and then forks one program per command read on
stdin, one at a time. Each forked program is a whole Python process from
there on: it runs `trio_graceful.run`, then exits through the interpreter's
own shutdown (``threading._shutdown``, atexit, finalization), as a program
started afresh would.

Commands (one line each), and what it answers on stdout:

* ``start <stderr path> <drain seconds> <fast|slow>``: reaps the previous
  program, forks a new one with its stderr in the file, answers
  ``pid <pid>``, and ``exited <status>`` once it has exited (a negative
  status for a death by signal, as `subprocess` reports it). The program
  is reaped only at the next command, so that its pid cannot be reused
  while a test may still send it signals.

The program writes ``ready`` once ``main`` waits for STOP, ``stopping`` when
STOP came, and, with ``slow``, ``returned`` when `run` has returned; then it
takes about 0.1 s more to exit (a thread to join, an atexit function).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from typing import NoReturn

import trio

import trio_graceful

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def say(line: str) -> None:
    os.write(1, f"{line}\n".encode())


def program(drain: float, slow: bool) -> NoReturn:
    async def main() -> None:
        _, inbox = trio_graceful.current_runner().root.open_inbox()
        say("ready")
        await inbox.receive()  # STOP
        say("stopping")
        await trio.sleep(drain)

    status = trio_graceful.run(main, grace=10, signals=SIGNALS)
    if slow:
        threading.Thread(target=time.sleep, args=(0.05,)).start()
        atexit.register(time.sleep, 0.05)
        say("returned")
    sys.exit(status)


def exit_status(pid: int) -> int:
    """Wait for ``pid`` to exit, without reaping it; return its status."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    assert info is not None
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


def serve() -> None:
    previous: int | None = None
    for line in sys.stdin:
        if previous is not None:
            os.waitpid(previous, 0)
        command, path, drain, speed = line.split()
        assert command == "start", line
        pid = os.fork()
        if pid == 0:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 2)
            os.close(fd)
            program(float(drain), speed == "slow")
        previous = pid
        say(f"pid {pid}")
        say(f"exited {exit_status(pid)}")


if __name__ == "__main__":
    serve()
