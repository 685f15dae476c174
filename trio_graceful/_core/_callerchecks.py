"""Who may call a bundle's operations: the checks, made before anything changes.

`Bundle.cancel` and `Bundle.shutdown` wait for the children, so they must be
called from the Trio run that owns the bundle, and from no task inside it
(it would wait for itself). `Bundle.note` and `Bundle.note_abandoned` speak
for a child, so only a child may call them. Each message says what to do
instead.
"""

from __future__ import annotations

import trio

from ._checks import check_string
from ._lowlevel import in_run_of
from ._paths import is_inside


def check_waiter(
    method: str,
    bundle: str,
    token: trio.lowlevel.TrioToken,
    inner: trio.Nursery,
    opener: trio.lowlevel.Task,
) -> None:
    """Refuse a caller of ``Bundle.<method>()`` that could not wait for the children.

    ``bundle`` is the bundle's name, ``token`` its run, ``inner`` its
    children's nursery and ``opener`` the task that opened it.

    Raises:
        RuntimeError: if called from another thread or Trio run, or from a
            task inside the bundle.
    """
    if not in_run_of(token):
        raise RuntimeError(
            f"Bundle.{method}() must be called from the Trio run that owns "
            f"bundle {bundle!r}; from another thread use "
            f"trio.from_thread.run(bundle.{method}, grace)"
        )
    caller = trio.lowlevel.current_task()
    if is_inside(caller, inner, opener):
        raise RuntimeError(
            f"Bundle.{method}() was called from {caller!r}, "
            f"which runs inside bundle {bundle!r} and would wait for "
            f"itself; call it from the task that owns the bundle, or use "
            f"bundle.cancel_scope.cancel() for a hard cancel"
        )


def check_child_says(
    method: str, argument: str, value: object, bundle: str, is_child: bool
) -> None:
    """Refuse a ``Bundle.<method>(<argument>)`` that is no child's string.

    ``is_child`` tells whether the calling task is a child of the bundle
    called ``bundle``.

    Raises:
        TypeError: if ``value`` is not a string.
        RuntimeError: if the caller is not a child of the bundle.
    """
    check_string(argument, value)
    if not is_child:
        raise RuntimeError(
            f"{method}() must be called by a child of bundle "
            f"{bundle!r}, not by {trio.lowlevel.current_task()!r}"
        )
