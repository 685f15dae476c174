"""A text picture of a Trio run's tasks and threads, and where each one waits.

The emergency exit prints it from the watchdog thread while the Trio thread
may still be running, or stuck in a blocking call. Reading Trio's task tree
from another thread is not something Trio supports, so this module only
reads (never changes) plain attributes, copies every collection before
walking it, and starts over if the tree changed under it. The picture is a
snapshot that may be slightly inconsistent (a task that ended during the
walk, a frame that moved on), which is good enough to say what was stuck.

What an operator needs from it is where *their* code waits: the frames of
trio and of trio_graceful itself (a dozen per task, for a handful of the
program's) are summed up in one line unless ``internals=True``.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Collection
from types import FrameType

import trio

from ..._core._log import plural

_ATTEMPTS = 3
_TRIO_CORE = os.path.join(os.path.dirname(trio.__file__), "_core", "")


def _package_directory() -> str:
    """The directory of the whole package, however deep this module sits in it."""
    package = sys.modules[__name__.partition(".")[0]]
    assert package.__file__ is not None
    return os.path.join(os.path.dirname(os.path.abspath(package.__file__)), "")


_LIBRARIES = (os.path.join(os.path.dirname(trio.__file__), ""), _package_directory())


def format_task_tree(root: trio.lowlevel.Task, *, internals: bool = True) -> str:
    """Describe ``root`` and its descendants, one task per line, with await frames.

    Each task is followed by the chain of frames it is suspended in, from its
    own coroutine down to the innermost wait (the frames of Trio's scheduler,
    the same for every task, are left out). The task that is running at
    the moment of the snapshot (in the Trio thread) is marked: its await
    chain is empty, and the thread stacks show where it is.

    With ``internals=False``, each run of frames in trio or trio_graceful
    becomes one line, ``(N frames in trio, trio_graceful)``.

    Safe to call from any thread; never raises.
    """
    error: Exception | None = None
    for _ in range(_ATTEMPTS):
        lines: list[str] = []
        try:
            _describe(root, 0, lines, internals)
        except Exception as exc:  # the tree changed while being read
            error = exc
            continue
        return "\n".join(lines) + "\n"
    return f"(the task tree kept changing while being read: {error!r})\n"


def _describe(
    task: trio.lowlevel.Task, depth: int, lines: list[str], internals: bool
) -> None:
    pad = "  " * depth
    running = bool(getattr(task.coro, "cr_running", False))
    lines.append(f"{pad}{task.name}{'  (running now)' if running else ''}")
    hidden = 0
    for frame, lineno in list(task.iter_await_frames()):
        code = frame.f_code
        if code.co_filename.startswith(_TRIO_CORE):
            continue  # the scheduler's traps say nothing about the task
        if not internals and code.co_filename.startswith(_LIBRARIES):
            hidden += 1
            continue
        if hidden:
            lines.append(_hidden_line(pad + "  ", hidden))
            hidden = 0
        lines.append(f"{pad}    {code.co_filename}:{lineno} in {code.co_name}")
    if hidden:
        lines.append(_hidden_line(pad + "  ", hidden))
    children: list[trio.lowlevel.Task] = []
    for nursery in list(task.child_nurseries):
        children.extend(nursery.child_tasks)
    # Sets have no order; sort so that the same tree prints the same way.
    for child in sorted(children, key=lambda t: (t.name, id(t))):
        _describe(child, depth + 1, lines, internals)


def format_thread_stacks(*, skip: Collection[int], internals: bool = True) -> str:
    """Describe the stack of every thread but those in ``skip`` (thread idents).

    In `faulthandler`'s format with the thread's name added, most recent
    call first; library frames are summed up as in `format_task_tree` unless
    ``internals=True``. Safe to call from any thread; never raises.
    """
    try:
        frames = sys._current_frames()  # pyright: ignore[reportPrivateUsage]
        names = {t.ident: t.name for t in threading.enumerate()}
        lines: list[str] = []
        for ident, frame in frames.items():
            if ident in skip:
                continue
            name = f" {names[ident]!r}" if ident in names else ""
            lines.append(f"Thread {ident:#018x}{name} (most recent call first):")
            hidden = 0
            stack: FrameType | None = frame
            while stack is not None:
                code = stack.f_code
                if not internals and code.co_filename.startswith(_LIBRARIES):
                    hidden += 1
                else:
                    if hidden:
                        lines.append(_hidden_line("", hidden))
                        hidden = 0
                    lines.append(
                        f'  File "{code.co_filename}", line {stack.f_lineno} '
                        f"in {code.co_name}"
                    )
                stack = stack.f_back
            if hidden:
                lines.append(_hidden_line("", hidden))
            lines.append("")
        return "\n".join(lines)
    except Exception as exc:
        return f"(the thread stacks could not be read: {exc!r})\n"


def _hidden_line(pad: str, count: int) -> str:
    return f"{pad}  ({plural(count, 'frame')} in trio, trio_graceful)"
