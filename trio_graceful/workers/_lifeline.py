"""The lifeline: how a worker learns that its supervisor is gone.

A supervisor killed outside a service manager (SIGKILL, the OOM killer)
leaves no cgroup to clean up: its workers, each in a process group of its
own, would serve on, holding the listening sockets, with nobody to stop
them. So the supervisor makes one pipe and passes its read end to every
worker (named in ``$TRIO_GRACEFUL_WORKER_LIFELINE``), while the write end
stays in the supervisor alone: it is not inheritable, and is never passed.
Nothing is ever written to it. When the supervisor dies, however it dies,
the kernel closes the write end, and every worker reads end of file.

A worker that watches its lifeline (`watch_supervisor`) then shuts down as
it would at SIGTERM: it stops accepting first, and drains within its grace.

Not ``PR_SET_PDEATHSIG``: that signal follows the thread that started the
child, not the process, and Trio starts processes from a thread of its own.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator, MutableMapping
from typing import Any

import trio

from .. import InboxReceiver, current_runner
from ._workerprocess import LIFELINE_VARIABLE, logger


@contextlib.contextmanager
def open_lifeline() -> Generator[int]:
    """Make the supervisor's pipe for the block; yield its read end.

    Neither end is inheritable: the read end is passed to each worker
    explicitly (``pass_fds``), the write end never is. Both are closed at
    the end of the block. Not a checkpoint.
    """
    read_end, write_end = os.pipe()
    try:
        yield read_end
    finally:
        os.close(read_end)
        os.close(write_end)


def inherited_lifeline(environ: MutableMapping[str, str] = os.environ) -> int:
    """Take this worker's end of the lifeline: its descriptor.

    The variable is removed from ``environ``, and the descriptor made not
    inheritable, so that a program the worker starts does not take the
    lifeline for its own. Not a checkpoint.

    Raises:
        LookupError: if this process was not started by `serve_workers`
            (or its lifeline was taken already).
        ValueError: if ``$TRIO_GRACEFUL_WORKER_LIFELINE`` is not a descriptor
            of this process.
    """
    value = environ.pop(LIFELINE_VARIABLE, None)
    if value is None:
        raise LookupError(
            f"${LIFELINE_VARIABLE} is not set: this process was not started as a "
            f"worker by trio_graceful.workers.serve_workers"
        )
    if not value.isdigit():
        raise ValueError(f"{LIFELINE_VARIABLE} must be a descriptor, not {value!r}")
    fd = int(value)
    try:
        os.set_inheritable(fd, False)
        # Every worker shares the pipe; none of them ever blocks on it.
        os.set_blocking(fd, False)
    except OSError as exc:
        raise ValueError(
            f"{LIFELINE_VARIABLE}: descriptor {fd} is not open ({exc.strerror})"
        ) from exc
    return fd


async def watch_supervisor(
    inbox: InboxReceiver[Any],
    *,
    environ: MutableMapping[str, str] = os.environ,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Shut this worker down gracefully if its supervisor dies; a service.

    Run it as a service of the worker's `trio_graceful.run`::

        await runner.start_service(watch_supervisor)

    It takes the worker's end of the lifeline (`inherited_lifeline`) and
    waits. If the supervisor ends first (its end of the pipe closes, which
    the kernel does however it ends, SIGKILL included), it logs a warning and
    begins the program's shutdown, as SIGTERM would
    (`trio_graceful.Runner.request_shutdown`): the worker stops accepting
    and drains within its grace. Returns at STOP. This is a checkpoint.

    Raises:
        RuntimeError: if not run under `trio_graceful.run`.
        LookupError: if this process was not started by `serve_workers`;
            then it is raised before ``task_status.started``.
        ValueError: as `inherited_lifeline`.
    """
    runner = current_runner()
    fd = inherited_lifeline(environ)
    try:
        task_status.started()
        if await inbox.until_stop(_wait_closed, fd) is None:
            logger.warning("the supervisor is gone: this worker stops")
            runner.request_shutdown("the supervisor is gone")
            await inbox.until_stop(trio.sleep_forever)
    finally:
        os.close(fd)


async def _wait_closed(fd: int) -> None:
    """Wait for end of file on ``fd``: every write end is closed."""
    while True:
        await trio.lowlevel.wait_readable(fd)
        try:
            if not os.read(fd, 4096):
                return
        except BlockingIOError:
            pass  # another worker read what made it readable
