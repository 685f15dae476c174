"""Which bundle a thread, process or asyncio child answers to.

`run_in_thread`, `run_process` and `run_asyncio` run work that is not Trio
code as a child of a bundle: a child's STOP callbacks, notes and abandoned
work are recorded on that bundle. By default it is the bundle the calling
task is a child of (`current_bundle`), so ``bundle.start_soon(run_in_thread,
fn)`` does not have to name the bundle twice; ``bundle=`` names it
explicitly.
"""

from __future__ import annotations

import trio

from .._core._bundle import Bundle
from .._core._openbundle import current_bundle


def check_child_of(bundle: Bundle, caller: str) -> None:
    """Raise `RuntimeError` unless the current task is a child of ``bundle``.

    ``caller`` names the public function for the message.
    """
    task = trio.lowlevel.current_task()
    if task not in bundle:
        raise RuntimeError(
            f"{caller}() must be called by a child of bundle {bundle.name!r} "
            f"(a task started with its start_soon() or start()), not by {task!r}"
        )


def bundle_of_caller(bundle: object, caller: str) -> Bundle:
    """Return the bundle that the calling task, a child, runs ``caller`` for.

    ``bundle`` is the caller's ``bundle=`` argument: `None` stands for the
    bundle the calling task is a child of. Not a checkpoint.

    Raises:
        TypeError: if ``bundle`` is neither a `Bundle` nor None.
        RuntimeError: if the calling task is not a child of that bundle.
    """
    if bundle is None:
        try:
            bundle = current_bundle()
        except RuntimeError:
            task = trio.lowlevel.current_task()
            raise RuntimeError(
                f"{caller}() must be called by a child of a bundle (a task "
                f"started with its start_soon() or start()), not by {task!r}; "
                f"or pass the bundle as bundle="
            ) from None
    elif not isinstance(bundle, Bundle):
        raise TypeError(f"bundle must be a Bundle or None, not {bundle!r}")
    check_child_of(bundle, caller)
    return bundle
