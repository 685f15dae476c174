"""`open_bundle` and `current_bundle`: a bundle's ``async with`` block, and finding it.

The context manager opens the two levels (``_topology``), makes the `Bundle`
around them and registers it in its run (``_paths``); leaving the block waits
for the children as a nursery does, then closes the bundle. Both halves are
protected from KeyboardInterrupt, as a nursery's are, so that an interrupt is
raised in the body rather than between the levels. `current_bundle` finds
the bundle around the calling task in the same registry.
"""

from __future__ import annotations

from types import TracebackType
from typing import cast, final

import trio

from ._bundle import Bundle
from ._checks import check_name
from ._paths import enclosing_bundle
from ._phase import PhaseRecord
from ._topology import open_two_level


@final
class _BundleManager:
    """The async context manager returned by `open_bundle`."""

    __slots__ = ("_bundle", "_levels", "_name")

    def __init__(self, name: str | None, *, one_level: bool = False) -> None:
        self._name = name
        self._levels = open_two_level(one_level=one_level)
        self._bundle: Bundle | None = None

    @trio.lowlevel.enable_ki_protection
    async def __aenter__(self) -> Bundle:
        task = trio.lowlevel.current_task()
        name = self._name if self._name is not None else f"bundle in {task.name}"
        self._levels.owner = f"bundle {name!r}"
        levels = await self._levels.__aenter__()
        bundle = self._bundle = Bundle._create(  # pyright: ignore[reportPrivateUsage]
            name,
            levels,
            trio.lowlevel.current_trio_token(),
            enclosing_bundle(task),
            PhaseRecord(name),
        )
        bundle._opened()  # pyright: ignore[reportPrivateUsage]
        return bundle

    @trio.lowlevel.enable_ki_protection
    async def __aexit__(
        self,
        etype: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._bundle is not None
        try:
            return await self._levels.__aexit__(etype, exc, tb)
        finally:
            self._bundle._block_exited()  # pyright: ignore[reportPrivateUsage]


def open_bundle(*, name: str | None = None) -> _BundleManager:
    """Open a `Bundle`: a nursery whose children can be cancelled gracefully.

    Use it as ``async with trio_graceful.open_bundle() as bundle:``. The body
    starts children with `Bundle.start_soon` / `Bundle.start` and, when it is
    time to stop, calls ``await bundle.cancel(grace)`` (or `Bundle.shutdown`
    to send `STOP` first). Leaving the block waits for the children, exactly
    like a nursery.

    Entering the block is a schedule point but not a cancel point (the
    children's nursery is opened by a helper task); leaving it is a
    checkpoint, as for a nursery.

    Args:
        name (str or None): A name for reports, traces and task names;
            defaults to ``"bundle in <task name>"``.

    Raises:
        TypeError: if ``name`` is not a string or None.
    """
    return _BundleManager(check_name("name", name))


def open_bundle_cancelling_body(*, name: str) -> _BundleManager:
    """Open a bundle whose cancellation hard-cancels its body with the children.

    For an owner whose body only waits and settles things after the block
    (a job's supervisor): `Bundle.cancel` and `Bundle.shutdown` work as
    usual, except that the body, if still in the block when the children are
    hard-cancelled, is cancelled with them and leaves the block (the bundle's
    own scope catches that `trio.Cancelled`). The children see an ordinary
    bundle. It costs one nursery and no host task, and entering the block
    is not a checkpoint.
    """
    return _BundleManager(name, one_level=True)


def current_bundle() -> Bundle:
    """Return the bundle that the calling task belongs to.

    That is the bundle whose child the calling task is, or whose body it
    runs; for a task further down (in a plain nursery below a child, say),
    the nearest bundle up Trio's task tree. Not a checkpoint.

    Raises:
        RuntimeError: if the calling task is in no bundle, or if called
            outside a Trio run.
    """
    task = trio.lowlevel.current_task()
    bundle = enclosing_bundle(task)
    if bundle is None:
        raise RuntimeError(
            f"current_bundle() was called from {task.name!r}, which runs in no "
            f"bundle; pass the bundle explicitly"
        )
    # only bundles are registered in the paths' map
    return cast("Bundle", bundle)
