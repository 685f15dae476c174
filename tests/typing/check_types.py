"""Checked by mypy --strict and pyright --strict in CI, never run.

It pins the public typing promises: STOP narrows, inboxes are generic,
a Bundle's methods have the signatures of a trio.Nursery's.
"""

from __future__ import annotations

import trio
from typing_extensions import assert_type

from trio_graceful import (
    STOP,
    Bundle,
    CancelReport,
    InboxReceiver,
    InboxSender,
    StopType,
    open_bundle,
    open_inbox,
)


async def narrowing(rx: InboxReceiver[int]) -> None:
    msg = await rx.receive()
    assert_type(msg, int | StopType)
    if msg is STOP:
        stop: StopType = msg
        del stop
    else:
        assert_type(msg, int)
    async for item in rx:
        assert_type(item, int)


async def inbox_types() -> None:
    tx, rx = open_inbox[str](3)
    assert_type(tx, InboxSender[str])
    assert_type(rx, InboxReceiver[str])
    await tx.send("x")
    result = await rx.until_stop(trio.sleep, 1)
    assert_type(result, None | StopType)


async def job(x: int, y: str) -> None: ...


async def bundle_types() -> None:
    async with open_bundle(name="b") as bundle:
        assert_type(bundle, Bundle)
        bundle.start_soon(job, 1, "a")
        bundle.start_soon(job, 1, 2)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
        report = await bundle.cancel(grace=1.5)
        assert_type(report, CancelReport)
        tx, rx = bundle.open_inbox()
        del tx, rx


async def code_after_a_bundle_block_runs() -> None:
    # A bundle never swallows an exception a type checker should worry about:
    # "report" must not be "possibly unbound" after the block.
    async with open_bundle() as bundle:
        report = await bundle.shutdown(1)
    assert_type(report, CancelReport)
    async with open_bundle() as bundle:
        default_grace = await bundle.cancel()
    assert_type(default_grace, CancelReport)


async def echo(stream: trio.SocketStream) -> None: ...


async def a_bundle_is_a_handler_nursery() -> None:
    # trio.serve_tcp annotates handler_nursery as trio.Nursery: as_nursery()
    # is the typed way to pass a bundle, with no cast in user code.
    async with open_bundle(name="connections") as connections:
        assert_type(connections.as_nursery(), trio.Nursery)
        await trio.serve_tcp(echo, 0, handler_nursery=connections.as_nursery())
