"""Checked by mypy --strict and pyright --strict in CI, never run.

It pins the typing of stopping early and of iterating until STOP.
"""

from __future__ import annotations

import trio
from typing_extensions import assert_type

from trio_graceful import InboxReceiver, InboxSender, open_inbox


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
