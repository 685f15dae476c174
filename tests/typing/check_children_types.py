"""Checked by mypy --strict and pyright --strict in CI, never run.

The typing promises of the children of every kind: the thread function gets
the StopFlag first and its result type comes back, the asyncio function gets
an AsyncioInbox, run_process returns a CompletedProcess.
"""

from __future__ import annotations

import subprocess

from typing_extensions import assert_type

from trio_graceful import (
    STOP,
    AdmissionGate,
    AsyncioInbox,
    Bundle,
    StopFlag,
    StopType,
    ThreadBudget,
    run_asyncio,
    run_in_thread,
    run_process,
)


def blocking(flag: StopFlag, path: str, size: int) -> bytes:
    del path
    return b"x" * size if not flag.is_set() else b""


async def aio_worker(inbox: AsyncioInbox[int], scale: float) -> float:
    total = 0.0
    async for item in inbox:
        assert_type(item, int)
        total += item * scale
    message = await inbox.receive()
    assert_type(message, int | StopType)
    if message is not STOP:
        assert_type(message, int)
    return total


async def children(bundle: Bundle) -> None:
    # The bundle is the caller's own by default, or given by keyword.
    data = await run_in_thread(
        blocking,
        "f",
        3,
        bundle=bundle,
        name="reader",
        budget=ThreadBudget(4),
        gate=AdmissionGate(2, name="reads"),
    )
    assert_type(data, bytes)
    await run_in_thread(blocking, "f", "3")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]

    await run_in_thread(blocking, "f", 3, bundle=5)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]

    total = await run_asyncio(aio_worker, 2.0)
    assert_type(total, float)
    assert_type(await run_asyncio(aio_worker, 2.0, bundle=bundle), float)

    completed = await run_process(["true"], capture_stdout=True)
    assert_type(completed, subprocess.CompletedProcess[bytes])
    await run_process(["true"], bundle=bundle, start_new_session=False)
    # The bundle is no longer the first positional argument.
    await run_process(bundle, ["true"])  # type: ignore[arg-type, call-arg]  # pyright: ignore[reportArgumentType, reportCallIssue]


def limits() -> None:
    budget = ThreadBudget(total_tokens=8)
    gate = AdmissionGate(quota=2, name="beat")
    assert_type(budget.statistics().threads_abandoned, int)
    assert_type(gate.statistics().rejected_total, int)
    with gate:
        pass
