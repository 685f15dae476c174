"""Bundles and inboxes leave no reference cycles behind, as Trio's nurseries don't.

Cycles are freed only by the cyclic garbage collector, in pauses that grow
with the number of bundles: a server that hard-cancels a thousand
connections must not leave a thousand cycles.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Awaitable, Callable

import pytest
import trio

from trio_graceful import open_bundle

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup


async def cancelled_from_outside() -> None:
    with trio.CancelScope() as outer:
        async with open_bundle() as bundle:
            bundle.start_soon(trio.sleep_forever)
            await trio.lowlevel.checkpoint()
            outer.cancel()
            await trio.sleep_forever()


async def child_raises() -> None:
    async def boom() -> None:
        raise ValueError

    async def failing_bundle() -> None:
        async with open_bundle() as bundle:
            bundle.start_soon(boom)
            bundle.start_soon(trio.sleep_forever)

    with pytest.raises(BaseExceptionGroup):
        await failing_bundle()


async def grace_runs_out() -> None:
    async with open_bundle() as bundle:
        bundle.start_soon(trio.sleep_forever)
        await bundle.cancel(grace=0.001)


async def shutdown_with_inboxes() -> None:
    async with open_bundle() as bundle:
        _, inbox = bundle.open_inbox()
        bundle.start_soon(inbox.receive)
        _, dropped = bundle.open_inbox()  # never closed: just forgotten
        del dropped
        await bundle.shutdown(grace=1)


async def nested_cut_short() -> None:
    async def worker() -> None:
        async with open_bundle() as inner:
            inner.start_soon(trio.sleep_forever)
            await inner.cancel(grace=10)

    async with open_bundle() as bundle:
        bundle.start_soon(worker)
        await trio.lowlevel.checkpoint()
        await bundle.cancel(grace=0.001)


@pytest.mark.parametrize(
    "scenario",
    [
        cancelled_from_outside,
        child_raises,
        grace_runs_out,
        shutdown_with_inboxes,
        nested_cut_short,
    ],
)
async def test_no_cycles(scenario: Callable[[], Awaitable[None]]) -> None:
    gc.collect()
    gc.disable()
    try:
        for _ in range(20):
            await scenario()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        leftovers = [type(o).__name__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert leftovers == []
