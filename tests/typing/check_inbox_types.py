"""Checked by mypy --strict and pyright --strict in CI, never run.

It pins the typing of stopping early and of iterating until STOP.
"""

from __future__ import annotations

import trio
from typing_extensions import Never, assert_type

from trio_graceful import Bundle, InboxReceiver, InboxSender, StopType, open_inbox


async def stop_first_and_drain() -> None:
    tx, rx = open_inbox[bytes](10, stop_first=True)
    assert_type(tx, InboxSender[bytes])
    assert_type(rx, InboxReceiver[bytes])
    open_inbox[bytes](10, True)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    assert_type(rx.drain_nowait(), list[bytes])


async def iterate(
    rx: InboxReceiver[int], lines: trio.MemoryReceiveChannel[str]
) -> None:
    async for line in rx.iter_until_stop(lines):
        assert_type(line, str)


async def bundle_inboxes(bundle: Bundle) -> None:
    # The message type comes from the variables; without them the inbox
    # carries only STOP, and nothing can be sent (not Any).
    tx: InboxSender[float]
    rx: InboxReceiver[float]
    tx, rx = bundle.open_inbox(10)
    assert_type(await rx.receive(), float | StopType)
    tx.send_nowait(0.5)
    tx.send_nowait("0.5")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    stop_only_tx, stop_only = bundle.open_inbox()
    assert_type(stop_only_tx, InboxSender[Never])
    assert_type(stop_only, InboxReceiver[Never])
    assert_type(await stop_only.receive(), StopType)
    stop_only_tx.send_nowait(1)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    # A receiver is covariant: a STOP-only inbox fits any worker.
    await worker(stop_only)


async def worker(inbox: InboxReceiver[str]) -> None:
    async for line in inbox:
        assert_type(line, str)
