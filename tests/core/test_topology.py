"""A bundle's nurseries on their own: a body and children that act as one nursery."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from tests.support.exception_shapes import capture, shape
from trio_graceful._core._topology import ChildEvents, open_bundle_nurseries


async def test_children_can_be_cancelled_without_the_body(autojump_clock):
    body_ran_on: list[float] = []
    t0 = trio.current_time()
    async with open_bundle_nurseries() as nurseries:
        nurseries.start_soon(trio.sleep_forever, (), "child")
        nurseries.set_children_deadline(t0 + 2)
        await trio.sleep(5)
        body_ran_on.append(trio.current_time() - t0)
        assert nurseries.live == 0
        assert nurseries.children_cancel_called
        # the children's nursery stays open for late starters
        nurseries.start_soon(trio.sleep, (1,), "late")
    assert body_ran_on == [5]


async def test_the_outer_scope_cancels_body_and_children(autojump_clock):
    with trio.CancelScope() as outer:
        async with open_bundle_nurseries() as nurseries:
            nurseries.start_soon(trio.sleep_forever, (), "child")
            await trio.testing.wait_all_tasks_blocked()
            nurseries.outer.cancel_scope.cancel()
            await trio.sleep_forever()
    assert not outer.cancelled_caught  # caught by the nurseries' own scope
    assert nurseries.live == 0


async def _failing_child(open_thing):
    async def boom():
        await trio.sleep(1)
        raise ValueError("boom")

    async with open_thing() as n:
        if hasattr(n, "inner"):
            n.start_soon(boom, (), "boom")
            n.start_soon(trio.sleep_forever, (), "sleeper")
        else:
            n.start_soon(boom)
            n.start_soon(trio.sleep_forever)
        await trio.sleep_forever()


async def test_a_failing_child_ends_both_levels_as_a_nursery_would(autojump_clock):
    t0 = trio.current_time()
    expected = await capture(lambda: _failing_child(trio.open_nursery))
    t1 = trio.current_time()
    got = await capture(lambda: _failing_child(open_bundle_nurseries))
    assert shape(got) == shape(expected)
    assert trio.current_time() - t1 == t1 - t0 == 1


async def test_events_tell_each_start_and_end(autojump_clock):
    seen: list[tuple[str, str]] = []

    async def ready_later(*, task_status=trio.TASK_STATUS_IGNORED):
        await trio.sleep(1)
        task_status.started()
        await trio.sleep(1)

    async def never_ready(*, task_status=trio.TASK_STATUS_IGNORED):
        raise KeyError("before ready")

    async with open_bundle_nurseries() as nurseries:
        nurseries.events = ChildEvents(
            started=lambda task: seen.append(("started", task.name)),
            ready=lambda task: seen.append(("ready", task.name)),
            ended=lambda task, exc: seen.append(("ended", f"{task.name} {exc!r}")),
            start_failed=lambda task: seen.append(("start failed", task.name)),
        )
        nurseries.start_soon(trio.sleep, (3,), "soon")
        await nurseries.start(ready_later, (), "later")
        with pytest.raises(KeyError):
            await nurseries.start(never_ready, (), "never")
    assert seen == [
        ("started", "soon"),
        ("ready", "later"),
        ("start failed", "never"),
        ("ended", "later None"),
        ("ended", "soon None"),
    ]


async def test_wrong_arguments_raise_before_anything_starts(autojump_clock):
    async def takes_one(x: int) -> None:
        await trio.sleep(x)

    async with open_bundle_nurseries() as nurseries:
        with pytest.raises(TypeError, match="missing 1 required positional"):
            nurseries.start_soon(takes_one, (), "child")
        with pytest.raises(TypeError, match="returned 5 instead of a coroutine"):
            nurseries.start_soon(lambda: 5, (), "child")
        assert nurseries.live == 0


async def test_late_children_start_cancelled_or_with_the_deadline(autojump_clock):
    ended: list[tuple[str, float]] = []
    t0 = trio.current_time()

    async def child(name: str) -> None:
        try:
            await trio.sleep_forever()
        finally:
            ended.append((name, trio.current_time() - t0))

    async with open_bundle_nurseries() as nurseries:
        nurseries.set_children_deadline(t0 + 3)
        nurseries.start_soon(child, ("before",), "before")
        await trio.sleep(1)
        nurseries.start_soon(child, ("after the deadline was set",), "after")
        await trio.sleep(5)
        nurseries.cancel_children("enough")
        nurseries.start_soon(child, ("after the cancel",), "late")
        await trio.sleep(1)
        assert nurseries.live == 0
        body_time = trio.current_time() - t0
    assert sorted(ended) == [
        ("after the cancel", 6),
        ("after the deadline was set", 3),
        ("before", 3),
    ]
    assert body_time == 7


async def test_a_child_cancelled_before_it_is_ready_fails_its_start(autojump_clock):
    async def slow_start(*, task_status=trio.TASK_STATUS_IGNORED):
        await trio.sleep(10)
        task_status.started()

    async with open_bundle_nurseries() as nurseries:
        nurseries.owner = "bundle 'b'"
        nurseries.set_children_deadline(trio.current_time() + 1)
        with pytest.raises(RuntimeError, match="bundle 'b' was hard-cancelled before"):
            await nurseries.start(slow_start, (), "slow")
        assert nurseries.live == 0


async def test_cancelling_body_with_children_fails_as_a_nursery_would(autojump_clock):
    expected = await capture(lambda: _failing_child(trio.open_nursery))
    got = await capture(
        lambda: _failing_child(
            lambda: open_bundle_nurseries(cancel_body_with_children=True)
        )
    )
    assert shape(got) == shape(expected)


async def test_cancelling_body_with_children_cancels_the_body_too(autojump_clock):
    t0 = trio.current_time()
    reached: list[str] = []
    async with open_bundle_nurseries(cancel_body_with_children=True) as nurseries:
        nurseries.start_soon(trio.sleep_forever, (), "child")
        nurseries.set_children_deadline(t0 + 2)
        await trio.sleep(5)
        reached.append("after the sleep")
    assert reached == []
    assert trio.current_time() - t0 == 2
    assert nurseries.live == 0
    assert nurseries.outer.cancel_scope.cancelled_caught
