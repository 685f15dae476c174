"""Subprocesses as children of a bundle: STOP is a signal, hard cancel is SIGKILL.

`run_process` wraps `trio.run_process`, so input, output capture and
redirection work exactly as there. What it adds is the bundle's rules: STOP
sends the process a signal of the caller's choice (SIGTERM by default), the
grace is its time to exit, and at the hard cancel it gets SIGKILL. How the
process ended is noted in the `CancelReport` (`ChildEnd.notes`).

Signals travel by process group, so the process gets a session and a group
of its own by default: the terminal's Ctrl+C, sent to the program's group,
then reaches the program, whose bundle passes it on as STOP within the
grace, instead of killing the process at once. The bundle's signals go to
the process's group in turn, so what the process started (a shell's
commands) gets them too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any, cast, final

import attrs
import trio

from .._core._checks import check_bool, check_signal
from .._core._groups import first_leaf, is_cancellation
from .._core._lowlevel import signal_name
from ._parentbundle import bundle_of_caller

if TYPE_CHECKING:
    from _typeshed import StrOrBytesPath

    from .._core._bundle import Bundle


@final
@attrs.define(eq=False, slots=False)
class _ProcessWatch(trio.TaskStatus[trio.Process]):
    """Learns the process from `trio.run_process` and signals it on STOP."""

    stop_signal: int
    # The caller's task_status, when run_process was started with start().
    outer_status: trio.TaskStatus[trio.Process]
    process: trio.Process | None = None
    # Whether the process leads a process group of its own, which is then
    # signalled as a whole.
    group: bool = False
    stop_requested: bool = False
    stop_sent: bool = False
    killed: bool = False

    def started(self, value: trio.Process | None = None) -> None:
        assert value is not None
        self.process = value
        # Popen returns once the program runs, so its group is settled. The
        # process cannot have been reaped yet: the pid is still its own.
        with contextlib.suppress(ProcessLookupError):
            self.group = os.getpgid(value.pid) == value.pid
        if self.stop_requested:
            self._send_stop()  # STOP came while the process was starting
        if self.outer_status is not trio.TASK_STATUS_IGNORED:
            self.outer_status.started(value)

    def stop(self) -> None:
        self.stop_requested = True
        if self.process is not None:
            self._send_stop()

    def _send_stop(self) -> None:
        if self._signal(self.stop_signal):
            self.stop_sent = True

    async def kill(self, process: trio.Process) -> None:
        # trio.run_process's deliver_cancel: the grace is over, no more asking.
        if self._signal(signal.SIGKILL):
            self.killed = True

    def _signal(self, signum: int) -> bool:
        """Send ``signum`` to the process (and its group); False if it has ended."""
        process = self.process
        assert process is not None
        # returncode reaps a process that has ended, so a pid still unreaped
        # here cannot have been reused by another process.
        if process.returncode is not None:
            return False
        if self.group:
            try:
                os.killpg(process.pid, signum)
            except ProcessLookupError:  # pragma: no cover - ended meanwhile
                return False
        else:
            process.send_signal(signum)
        return True

    def describe(self) -> str | None:
        """How the process ended, for the report; None if it never ran."""
        process = self.process
        if process is None or process.returncode is None:
            return None
        steps: list[str] = []
        if self.stop_sent:
            steps.append(f"got {signal_name(self.stop_signal)} on STOP")
        if self.killed:
            steps.append("got SIGKILL at the hard cancel")
        code = process.returncode
        if code < 0:
            steps.append(f"ended by {signal_name(-code)}")
        else:
            steps.append(f"exited with status {code}")
        return f"process {process.pid} ({_program(process.args)}): " + "; ".join(steps)

    @property
    def ended_by_stop_signal(self) -> bool:
        assert self.process is not None
        return self.stop_sent and self.process.returncode == -self.stop_signal


def _check_command(command: object) -> None:
    """Refuse a command that names no program, before anything starts."""
    path_types = (str, bytes, os.PathLike)
    parts: Sequence[object]
    if isinstance(command, path_types):
        parts = (cast("object", command),)
    elif isinstance(command, Sequence) and all(
        isinstance(part, path_types) for part in cast("Sequence[object]", command)
    ):
        parts = cast("Sequence[object]", command)
    else:
        raise TypeError(
            f"command must be a string, bytes, a path or a sequence of them, "
            f"not {command!r}"
        )
    if not parts or not os.fspath(cast("str", parts[0])):
        raise ValueError(f"command must name a program to run, not {command!r}")


def _program(args: object) -> str:
    if isinstance(args, (str, bytes)):
        first = os.fsdecode(args).split(maxsplit=1)[0] if args else ""
    else:
        first = os.fsdecode(cast("Sequence[Any]", args)[0])
    return os.path.basename(first)


async def run_process(
    command: StrOrBytesPath | Sequence[StrOrBytesPath],
    *,
    bundle: Bundle | None = None,
    stop_signal: int = signal.SIGTERM,
    start_new_session: bool = True,
    stdin: bytes | bytearray | memoryview | int | IO[Any] | None = b"",
    capture_stdout: bool = False,
    capture_stderr: bool = False,
    check: bool = True,
    task_status: trio.TaskStatus[trio.Process] = trio.TASK_STATUS_IGNORED,
    **options: object,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``command`` in a subprocess as a child of a bundle, and wait for it.

    This is `trio.run_process` under the bundle's rules:

    * When STOP reaches the child (`Bundle.shutdown`), the process gets
      ``stop_signal``. The grace is its time to clean up and exit.
    * When the child is hard-cancelled (the grace ran out, or anything else
      cancelled it), the process gets SIGKILL at once; `run_process` waits
      for it to die, then raises `trio.Cancelled`.
    * If the process ends during a cancellation of the bundle, how it ended
      is noted in its `ChildEnd.notes`, for instance ``"process 4242
      (worker): got SIGTERM on STOP; exited with status 0"``.
    * The process starts in a session, and so a process group, of its own
      (``start_new_session=True``), so the signals a terminal sends to the
      foreground process group (Ctrl+C) reach the program, not the process:
      it hears of them from the bundle, as STOP. Both signals go to the
      process's whole group, so what a ``sh -c`` command started gets them
      too. With ``start_new_session=False`` (or a ``process_group`` other
      than 0) the process shares a group with others, and only the process
      itself is signalled.

    Start it as a child (``bundle.start_soon(run_process, cmd)``) or call it
    from one; the bundle is the one the calling task is a child of, unless
    ``bundle=`` names it. Start it with ``process = await
    bundle.start(run_process, cmd)`` to get the `trio.Process` back as soon
    as it runs, with pipes to talk to it (``stdin=subprocess.PIPE``,
    ``stdout=subprocess.PIPE``).

    ``stdin``, ``capture_stdout``, ``capture_stderr``, ``check`` and
    ``**options`` mean what they mean for `trio.run_process`, with one
    difference: with ``check=True``, a process that was sent
    ``stop_signal`` and died of it has done what it was asked, and is not an
    error.

    Every argument is checked before anything starts. This is a checkpoint.

    Args:
        command (list or str): The command, as for `trio.run_process`.
        bundle (Bundle or None): The bundle whose child runs the process;
            `None` (the default) means the calling task's own bundle.
        stop_signal (int): The signal sent on STOP; SIGTERM by default.
        start_new_session (bool): Start the process in a new session and
            process group (the default), as for `subprocess.Popen`.
        stdin: The process's input, as for `trio.run_process`.
        capture_stdout (bool): Capture the standard output.
        capture_stderr (bool): Capture the standard error.
        check (bool): Raise `subprocess.CalledProcessError` if the process
            fails (exits with a nonzero status, or dies of a signal other
            than ``stop_signal`` sent on STOP).
        task_status: Given by `Bundle.start`; gets the `trio.Process`.
        **options: Other `trio.Process` options (``cwd``, ``env``,
            ``stdout``, ``stderr``, ...).

    Returns:
        subprocess.CompletedProcess: the return code and captured output.

    Raises:
        TypeError: if ``command``, ``bundle``, ``stop_signal``, ``stdin`` or
            a flag has the wrong type.
        ValueError: if ``command`` is empty, ``stop_signal`` is not a valid
            signal, or a pipe is asked for without `Bundle.start`.
        RuntimeError: if the calling task is not a child of the bundle.
        subprocess.CalledProcessError: if ``check`` and the process failed.
        OSError: if the process could not be started.
    """
    _check_command(command)
    stop = check_signal("stop_signal", stop_signal)
    flags = {
        "start_new_session": start_new_session,
        "capture_stdout": capture_stdout,
        "capture_stderr": capture_stderr,
        "check": check,
    }
    for argument, value in flags.items():
        check_bool(argument, value)
    if isinstance(stdin, bool) or not (
        stdin is None
        or isinstance(stdin, (bytes, bytearray, memoryview, int))
        or hasattr(stdin, "fileno")
    ):
        raise TypeError(
            f"stdin must be bytes, a file descriptor, a file or None, not {stdin!r}"
        )
    if task_status is trio.TASK_STATUS_IGNORED:
        pipes = {"stdin": stdin, **options}
        for stream in ("stdin", "stdout", "stderr"):
            if pipes.get(stream) is subprocess.PIPE:
                raise ValueError(
                    f"{stream}=subprocess.PIPE needs "
                    f"bundle.start(run_process, ...), which returns the "
                    f"Process and its pipes"
                )
    bundle = bundle_of_caller(bundle, "run_process")
    watch = _ProcessWatch(stop, task_status)

    try:
        with bundle.on_stop(watch.stop):
            completed = await trio.run_process(
                command,
                stdin=stdin,
                capture_stdout=capture_stdout,
                capture_stderr=capture_stderr,
                check=False,
                deliver_cancel=watch.kill,
                start_new_session=start_new_session,
                task_status=watch,
                **cast("dict[str, Any]", options),
            )
    except BaseException as exc:
        _note_end(bundle, watch)
        leaf = first_leaf(exc)
        if leaf is not exc and is_cancellation(exc):
            # trio.run_process wraps its Cancelled in a group; callers
            # cancelled out of a child deserve a plain one.
            raise leaf from None
        raise
    _note_end(bundle, watch)
    if check and completed.returncode and not watch.ended_by_stop_signal:
        raise subprocess.CalledProcessError(
            completed.returncode,
            completed.args,
            output=completed.stdout,
            stderr=completed.stderr,
        )
    return completed


def _note_end(bundle: Bundle, watch: _ProcessWatch) -> None:
    # Only a cancellation's report shows notes; a child that runs process
    # after process must not pile them up in between.
    description = watch.describe()
    if description is not None and bundle.cancelling:
        bundle.note(description)
