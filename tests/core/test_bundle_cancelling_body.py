"""A bundle whose hard cancel ends its body too: the shape a job runs in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

from trio_graceful import ChildOutcome, current_bundle, open_bundle
from trio_graceful._core._openbundle import open_bundle_cancelling_body


async def test_the_grace_running_out_ends_the_body_with_the_children(
    autojump_clock: trio.testing.MockClock,
) -> None:
    t0 = trio.current_time()
    ended: list[float] = []
    reached: list[str] = []

    async def stubborn() -> None:
        try:
            await trio.sleep_forever()
        finally:
            ended.append(trio.current_time() - t0)

    async with open_bundle_cancelling_body(name="job") as bundle:
        bundle.start_soon(stubborn)
        await trio.sleep(1)
        await bundle.shutdown(2)
        reached.append("after shutdown")
    assert (ended, reached) == ([3], [])
    assert trio.current_time() - t0 == 3
    assert bundle.cancel_scope.cancelled_caught
    assert bundle.closed


async def test_children_that_stop_in_time_leave_the_body_running(
    autojump_clock: trio.testing.MockClock,
) -> None:
    t0 = trio.current_time()

    async def polite() -> None:
        stop = trio.Event()
        with current_bundle().on_stop(stop.set):
            await stop.wait()
        await trio.sleep(1)  # its own shutdown work

    async with open_bundle_cancelling_body(name="job") as bundle:
        bundle.start_soon(polite, name="polite")
        await trio.testing.wait_all_tasks_blocked()
        report = await bundle.shutdown(5)
        body_went_on_at = trio.current_time() - t0
    assert body_went_on_at == 1
    assert [(end.name, end.outcome) for end in report.children] == [
        ("polite", ChildOutcome.FINISHED)
    ]
    assert report.hard_cancelled_at is None
    assert not bundle.cancel_scope.cancel_called


async def test_its_children_see_an_ordinary_bundle(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen: list[object] = []

    async def child() -> None:
        bundle = current_bundle()
        seen.append((bundle.name, trio.lowlevel.current_task() in bundle))
        with pytest.raises(RuntimeError, match="would wait for"):
            await bundle.cancel(1)

    async with open_bundle_cancelling_body(name="job") as bundle:
        bundle.start_soon(child)
        assert current_bundle() is bundle  # the body's too
    assert seen == [("job", True)]


@pytest.mark.parametrize(
    ("opener", "schedule_point"),
    [(open_bundle, True), (open_bundle_cancelling_body, False)],
)
async def test_entering_is_a_schedule_point_only_with_a_host_task(
    autojump_clock: trio.testing.MockClock,
    opener: Callable[..., Any],
    schedule_point: bool,
) -> None:
    ran: list[str] = []

    async def sibling() -> None:
        ran.append("sibling")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sibling)
        async with opener(name="b"):
            ran_on_entry = list(ran)
    assert ran_on_entry == (["sibling"] if schedule_point else [])
    assert ran == ["sibling"]
