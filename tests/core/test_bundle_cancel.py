"""Bundle.cancel(grace): the timing rules, under the mock clock."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from tests.support.scheduling import StepCounter
from trio_graceful import ChildOutcome, open_bundle

# -- returns the moment the last child finishes -------------------------------


async def test_returns_exactly_when_last_child_finishes(autojump_clock):
    t0 = trio.current_time()
    async with open_bundle() as bundle:
        bundle.start_soon(trio.sleep, 3.25)
        bundle.start_soon(trio.sleep, 7.125)
        await trio.sleep(1)
        report = await bundle.cancel(grace=10)
        assert trio.current_time() - t0 == 7.125
        assert report.finished_at - t0 == 7.125
        assert report.elapsed == 6.125
        assert report.hard_cancelled_at is None
        assert report.graceful
        assert [c.outcome for c in report.children] == [ChildOutcome.FINISHED] * 2
        assert [c.ended_at - t0 for c in report.children] == [3.25, 7.125]


async def test_waiting_is_not_polling():
    # The caller is woken once, by the last child, whatever the grace.
    counter = StepCounter()
    trio.lowlevel.add_instrument(counter)
    try:
        async with open_bundle() as bundle:
            for _ in range(20):
                bundle.start_soon(trio.sleep, 0.05)
            me = trio.lowlevel.current_task()
            before = counter.steps.get(me, 0)
            await bundle.cancel(grace=math.inf)
            # one step to start waiting was already counted; one to wake up
            assert counter.steps[me] - before == 1
    finally:
        trio.lowlevel.remove_instrument(counter)


async def test_cancel_with_no_children_returns_at_once(autojump_clock):
    t0 = trio.current_time()
    async with open_bundle() as bundle:
        with trio.testing.assert_checkpoints():
            report = await bundle.cancel(grace=10)
        assert trio.current_time() == t0
        assert report.children == ()
        assert bundle.closed


# -- hard cancel when the grace runs out --------------------------------------


async def test_hard_cancels_at_exactly_the_grace(autojump_clock):
    t0 = trio.current_time()
    async with open_bundle() as bundle:
        bundle.start_soon(trio.sleep_forever, name="forever")
        bundle.start_soon(trio.sleep, 4, name="quick")
        report = await bundle.cancel(grace=10)
        assert trio.current_time() - t0 == 10
        assert report.hard_cancelled_at == t0 + 10
        assert [(c.name, c.outcome, c.elapsed) for c in report.children] == [
            ("quick", ChildOutcome.FINISHED, 4),
            ("forever", ChildOutcome.CANCELLED, 10),
        ]
        assert not report.graceful


async def test_body_is_not_cancelled_by_grace_expiry(autojump_clock):
    t0 = trio.current_time()
    body_went_on = False
    async with open_bundle() as bundle:
        bundle.start_soon(trio.sleep_forever)
        await bundle.cancel(grace=2)
        # The body's scope is untouched: it can still wait and be scheduled.
        assert trio.current_effective_deadline() == math.inf
        await trio.sleep(5)
        body_went_on = True
    assert body_went_on
    assert trio.current_time() - t0 == 7


async def test_waits_for_children_to_unwind_after_the_deadline(autojump_clock):
    t0 = trio.current_time()

    async def slow_cleanup():
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(2.5)

    async with open_bundle() as bundle:
        bundle.start_soon(slow_cleanup)
        report = await bundle.cancel(grace=3)
        assert trio.current_time() - t0 == 5.5
        assert report.children[0].outcome is ChildOutcome.CANCELLED
        assert report.children[0].elapsed == 5.5
        assert report.hard_cancelled_at == t0 + 3


async def test_child_that_swallows_cancelled_counts_as_cancelled(autojump_clock):
    async def swallow():
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            return  # swallowing Cancelled is bad style, but it must be reported

    async with open_bundle() as bundle:
        bundle.start_soon(swallow)
        report = await bundle.cancel(grace=1)
    assert report.children[0].outcome is ChildOutcome.CANCELLED


# -- the caller is cancelled --------------------------------------------------


async def test_caller_cancelled_hard_cancels_everything_at_once(autojump_clock):
    t0 = trio.current_time()
    ended: list[float] = []

    async def child():
        try:
            await trio.sleep_forever()
        finally:
            ended.append(trio.current_time() - t0)

    caught: list[BaseException] = []
    async with open_bundle() as bundle:
        bundle.start_soon(child)
        bundle.start_soon(child)
        with trio.move_on_after(3):
            try:
                await bundle.cancel(grace=10)
            except trio.Cancelled as exc:  # a plain Cancelled, not a group
                caught.append(exc)
                raise
        assert trio.current_time() - t0 == 3
    assert len(caught) == 1
    assert ended == [3, 3]


async def test_caller_in_other_task_cancelled_hard_cancels_children(autojump_clock):
    t0 = trio.current_time()
    async with open_bundle() as bundle:
        bundle.start_soon(trio.sleep_forever)
        async with trio.open_nursery() as nursery:

            async def canceller():
                await bundle.cancel(grace=100)

            nursery.start_soon(canceller)
            await trio.sleep(4)
            nursery.cancel_scope.cancel()
        # the canceller's cancellation reached the children at once
        await trio.testing.wait_all_tasks_blocked()
        assert bundle.statistics().children_running == 0
        assert trio.current_time() - t0 == 4


async def test_cancelled_out_of_a_bundle_is_plain_cancelled(autojump_clock):
    seen: list[BaseException] = []
    with trio.CancelScope() as outer:
        try:
            async with open_bundle() as bundle:
                bundle.start_soon(trio.sleep_forever)
                bundle.start_soon(trio.sleep_forever)
                outer.cancel()
                await trio.sleep_forever()
        except BaseException as exc:
            seen.append(exc)
            raise
    assert outer.cancelled_caught
    assert len(seen) == 1
    assert type(seen[0]) is trio.Cancelled


# -- grace values and repeated calls ------------------------------------------


async def test_grace_zero_is_an_immediate_hard_cancel(autojump_clock):
    t0 = trio.current_time()
    async with open_bundle() as bundle:
        bundle.start_soon(trio.sleep_forever)
        report = await bundle.cancel(grace=0)
        assert trio.current_time() == t0
        assert report.hard_cancelled_at == t0
        assert report.children[0].outcome is ChildOutcome.CANCELLED


async def test_grace_inf_waits_as_long_as_it_takes(autojump_clock):
    t0 = trio.current_time()
    async with open_bundle() as bundle:
        bundle.start_soon(trio.sleep, 1e6)
        report = await bundle.cancel(grace=math.inf)
        assert trio.current_time() - t0 == 1e6
        assert bundle.hard_deadline == math.inf
        assert report.hard_deadline == math.inf
        assert report.graceful


async def test_shorter_grace_moves_deadline_earlier(autojump_clock):
    t0 = trio.current_time()
    returned: list[float] = []
    reports = []

    async def cancel_after(delay, grace):
        await trio.sleep(delay)
        reports.append(await bundle.cancel(grace=grace))
        returned.append(trio.current_time() - t0)

    async with trio.open_nursery() as nursery, open_bundle() as bundle:
        bundle.start_soon(trio.sleep_forever)
        nursery.start_soon(cancel_after, 0, 10)
        nursery.start_soon(cancel_after, 2, 3)
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(2)
        await trio.testing.wait_all_tasks_blocked()
        assert bundle.hard_deadline == t0 + 5
    assert returned == [5, 5]
    assert reports[0] is reports[1]


async def test_longer_grace_never_moves_deadline_later(autojump_clock):
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery, open_bundle() as bundle:
        bundle.start_soon(trio.sleep_forever)
        nursery.start_soon(bundle.cancel, 4)
        await trio.sleep(1)
        report = await bundle.cancel(grace=100)
        assert trio.current_time() - t0 == 4
        assert bundle.hard_deadline == t0 + 4
        assert report.hard_deadline == t0 + 4


async def test_concurrent_callers_all_return_when_children_done(autojump_clock):
    t0 = trio.current_time()
    returned: list[float] = []

    async def caller():
        await bundle.cancel(grace=10)
        returned.append(trio.current_time() - t0)

    async with open_bundle() as bundle:
        bundle.start_soon(trio.sleep, 6)
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(caller)
    assert returned == [6] * 5


async def test_cancel_after_finish_returns_same_report(autojump_clock):
    async with open_bundle() as bundle:
        bundle.start_soon(trio.sleep, 1)
        first = await bundle.cancel(grace=5)
        t = trio.current_time()
        with trio.testing.assert_checkpoints():
            second = await bundle.cancel(grace=0)
        assert second is first
        assert trio.current_time() == t


# -- children started while cancelling; closed afterwards ---------------------


async def test_child_started_while_cancelling_gets_the_deadline(autojump_clock):
    t0 = trio.current_time()
    seen_deadline: list[float] = []

    async def late_child():
        seen_deadline.append(trio.current_effective_deadline())
        await trio.sleep(100)

    async with trio.open_nursery() as nursery, open_bundle() as bundle:
        bundle.start_soon(trio.sleep, 8)
        nursery.start_soon(bundle.cancel, 10)
        await trio.sleep(4)
        bundle.start_soon(late_child, name="late")
        await trio.testing.wait_all_tasks_blocked()
        assert seen_deadline == [t0 + 10]
    assert trio.current_time() - t0 == 10


async def test_child_started_while_cancelling_is_waited_for(autojump_clock):
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery, open_bundle() as bundle:

        async def cancel_and_check():
            report = await bundle.cancel(grace=10)
            assert trio.current_time() - t0 == 7
            assert [c.name for c in report.children] == ["first", "late"]

        bundle.start_soon(trio.sleep, 2, name="first")
        nursery.start_soon(cancel_and_check)
        await trio.sleep(1)
        bundle.start_soon(trio.sleep, 6, name="late")
    assert trio.current_time() - t0 == 7


async def test_start_while_cancelling_gets_the_deadline_before_started(autojump_clock):
    t0 = trio.current_time()

    async def never_ready(task_status=trio.TASK_STATUS_IGNORED):
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery, open_bundle(name="b") as bundle:
        bundle.start_soon(trio.sleep_forever)
        nursery.start_soon(bundle.cancel, 5)
        await trio.sleep(1)
        with pytest.raises(
            RuntimeError,
            match=r"^bundle 'b' was hard-cancelled before '.*never_ready' called "
            r"task_status\.started\(\)$",
        ):
            await bundle.start(never_ready)
        assert trio.current_time() - t0 == 5


async def test_start_while_cancelling_ready_child_is_waited_for(autojump_clock):
    t0 = trio.current_time()

    async def ready_then_work(task_status=trio.TASK_STATUS_IGNORED):
        await trio.sleep(1)
        task_status.started("ready")
        await trio.sleep(2)

    async with trio.open_nursery() as nursery, open_bundle() as bundle:
        bundle.start_soon(trio.sleep, 1)
        nursery.start_soon(bundle.cancel, 10)
        await trio.testing.wait_all_tasks_blocked()
        assert await bundle.start(ready_then_work) == "ready"
    assert trio.current_time() - t0 == 3


async def test_start_after_hard_cancel_is_cancelled_at_once(autojump_clock):
    async def slow_start(task_status=trio.TASK_STATUS_IGNORED):
        await trio.sleep(1)
        task_status.started()

    async def hold(task_status=trio.TASK_STATUS_IGNORED):
        task_status.started()
        with trio.CancelScope(shield=True):
            await trio.sleep(3)

    async with trio.open_nursery() as nursery, open_bundle() as bundle:
        await bundle.start(hold)
        nursery.start_soon(bundle.cancel, 0)
        await trio.testing.wait_all_tasks_blocked()
        t = trio.current_time()
        with pytest.raises(RuntimeError, match="was hard-cancelled before"):
            await bundle.start(slow_start)
        assert trio.current_time() == t


async def test_pending_start_gets_the_deadline_when_cancel_begins(autojump_clock):
    t0 = trio.current_time()

    async def never_ready(task_status=trio.TASK_STATUS_IGNORED):
        await trio.sleep_forever()

    async def start_it():
        with pytest.raises(RuntimeError, match="was hard-cancelled before"):
            await bundle.start(never_ready)
        assert trio.current_time() - t0 == 6

    async with trio.open_nursery() as nursery, open_bundle() as bundle:
        nursery.start_soon(start_it)
        await trio.sleep(2)
        assert bundle.statistics().children_running == 1
        report = await bundle.cancel(grace=4)
        assert trio.current_time() - t0 == 6
        # a child that never became ready is not the bundle's child
        assert report.children == ()


async def test_pending_start_is_hard_cancelled_with_the_children(autojump_clock):
    t0 = trio.current_time()

    async def never_ready(task_status=trio.TASK_STATUS_IGNORED):
        await trio.sleep_forever()

    async def start_it():
        with pytest.raises(RuntimeError, match="was hard-cancelled before"):
            await bundle.start(never_ready)
        assert trio.current_time() - t0 == 3

    async with trio.open_nursery() as nursery, open_bundle() as bundle:
        nursery.start_soon(start_it)
        await trio.sleep(1)
        with trio.move_on_after(2):
            await bundle.cancel(grace=100)
        assert trio.current_time() - t0 == 3


async def test_start_after_caller_cancelled_hard_cancel(autojump_clock):
    async def slow_start(task_status=trio.TASK_STATUS_IGNORED):
        await trio.sleep(1)
        task_status.started()

    async def hold(task_status=trio.TASK_STATUS_IGNORED):
        task_status.started()
        with trio.CancelScope(shield=True):
            await trio.sleep(3)

    async with open_bundle() as bundle:
        await bundle.start(hold)
        with trio.move_on_after(1):
            await bundle.cancel(grace=100)  # the caller's cancel: hard cancel now
        t = trio.current_time()
        with pytest.raises(RuntimeError, match="was hard-cancelled before"):
            await bundle.start(slow_start)
        assert trio.current_time() == t


async def test_closed_after_cancel_returns(autojump_clock):
    async with open_bundle(name="jobs") as bundle:
        await bundle.cancel(grace=1)
        assert bundle.closed
        message = (
            r"^bundle 'jobs' is closed: cancel\(\) has finished; "
            r"no new tasks can be started$"
        )
        with pytest.raises(RuntimeError, match=message):
            bundle.start_soon(trio.sleep, 1)
        with pytest.raises(RuntimeError, match=message):
            await bundle.start(trio.sleep, 1)


async def test_inbox_and_callback_after_close_are_refused(autojump_clock):
    # Nothing could ever stop them: no shutdown can begin on a closed bundle.
    async with open_bundle(name="jobs") as bundle:
        await bundle.cancel(grace=1)
        with pytest.raises(
            RuntimeError,
            match=r"^bundle 'jobs' is closed: cancel\(\) has finished; "
            r"an inbox opened now would never get STOP$",
        ):
            bundle.open_inbox()
        with pytest.raises(
            RuntimeError,
            match=r"^bundle 'jobs' is closed: cancel\(\) has finished; "
            r"a callback registered now could never be called$",
        ):
            bundle.on_stop(print)
    assert bundle.statistics().inboxes == 0
    async with open_bundle(name="plain") as plain:
        pass
    with pytest.raises(
        RuntimeError,
        match=r"^bundle 'plain' is closed: its block has exited; "
        r"a callback registered now could never be called$",
    ):
        plain.on_stop(print)


async def test_closed_after_block_exits(autojump_clock):
    async with open_bundle(name="jobs") as bundle:
        bundle.start_soon(trio.sleep, 1)
    with pytest.raises(
        RuntimeError,
        match=r"^bundle 'jobs' is closed: its block has exited; "
        r"no new tasks can be started$",
    ):
        bundle.start_soon(trio.sleep, 1)


# -- one deadline, visible to children, composing with nesting ----------------


async def test_hard_deadline_is_visible_to_children(autojump_clock):
    t0 = trio.current_time()
    seen: list[float] = []

    async def child():
        await trio.sleep(1)
        seen.append(trio.current_effective_deadline())
        await trio.sleep_forever()

    async with open_bundle() as bundle:
        assert bundle.hard_deadline == math.inf
        bundle.start_soon(child)
        await bundle.cancel(grace=10)
        assert bundle.hard_deadline == t0 + 10
    assert seen == [t0 + 10]


async def test_nested_longer_grace_ends_at_outer_deadline(autojump_clock):
    t0 = trio.current_time()
    inner_started = trio.Event()
    outer_cancelling = trio.Event()
    inner_ends: list[float] = []

    async def nested_child():
        try:
            await trio.sleep_forever()
        finally:
            inner_ends.append(trio.current_time() - t0)

    async def worker():
        async with open_bundle(name="inner") as inner:
            inner.start_soon(nested_child)
            inner.start_soon(nested_child)
            inner_started.set()
            await outer_cancelling.wait()
            await trio.sleep(1)
            await inner.cancel(grace=20)  # asks for 20 s; the outer allows 10

    async with open_bundle(name="outer") as outer:
        outer.start_soon(worker)
        await inner_started.wait()
        outer_cancelling.set()
        report = await outer.cancel(grace=10)
        assert trio.current_time() - t0 == 10
    assert inner_ends == [10, 10]
    assert report.children[0].outcome is ChildOutcome.CANCELLED


async def test_nested_inner_finishing_early_returns_early(autojump_clock):
    t0 = trio.current_time()
    outer_cancelling = trio.Event()

    async def worker():
        async with open_bundle(name="inner") as inner:
            inner.start_soon(trio.sleep, 3)
            inner.start_soon(trio.sleep, 2)
            await outer_cancelling.wait()
            await inner.cancel(grace=20)

    async with open_bundle(name="outer") as outer:
        outer.start_soon(worker)
        await trio.testing.wait_all_tasks_blocked()
        outer_cancelling.set()
        report = await outer.cancel(grace=10)
    assert trio.current_time() - t0 == 3
    assert report.children[0].outcome is ChildOutcome.FINISHED
    assert report.children[0].elapsed == 3


# -- bad input ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("grace", "error", "message"),
    [
        (-1, ValueError, r"^grace must be >= 0, not -1$"),
        (-0.5, ValueError, r"^grace must be >= 0, not -0\.5$"),
        (math.nan, ValueError, r"^grace must be >= 0, not nan$"),
        (-math.inf, ValueError, r"^grace must be >= 0, not -inf$"),
        ("10", TypeError, r"^grace must be a number of seconds, not str '10'$"),
        (None, TypeError, r"^grace must be a number of seconds, not NoneType None$"),
        (True, TypeError, r"^grace must be a number of seconds, not bool True$"),
    ],
)
@pytest.mark.parametrize("method", ["cancel", "shutdown"])
async def test_bad_grace_raises_before_anything_changes(
    autojump_clock, method, grace, error, message
):
    async with open_bundle() as bundle:
        bundle.start_soon(trio.sleep, 1)
        _, receiver = bundle.open_inbox()
        with pytest.raises(error, match=message):
            await getattr(bundle, method)(grace)
        assert not bundle.cancelling
        assert bundle.hard_deadline == math.inf
        assert bundle.statistics().children_running == 1
        assert not receiver.statistics().stop_requested


async def test_open_bundle_rejects_bad_name():
    with pytest.raises(TypeError, match=r"^name must be a string or None, not 3$"):
        open_bundle(name=3)  # type: ignore[arg-type]


async def test_note_abandoned_names_what_was_left_running(autojump_clock):
    async def thread_like():
        bundle.note("started a thread")
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            bundle.note_abandoned("thread 'reader'")
            raise

    async with open_bundle(name="b") as bundle:
        bundle.start_soon(thread_like, name="t")
        bundle.start_soon(trio.sleep, 0.5, name="quick")
        with pytest.raises(
            RuntimeError,
            match=r"^note_abandoned\(\) must be called by a child of bundle 'b'",
        ):
            bundle.note_abandoned("nothing")
        with pytest.raises(
            RuntimeError, match=r"^note\(\) must be called by a child of bundle 'b'"
        ):
            bundle.note("nothing")
        report = await bundle.cancel(grace=1)
    assert [(c.name, c.abandoned, c.notes) for c in report.children] == [
        ("quick", (), ()),
        ("t", ("thread 'reader'",), ("started a thread",)),
    ]
    assert report.abandoned == ("thread 'reader'",)
    assert report.summary() == (
        "bundle 'b': 1 finished, 1 hard-cancelled, 0 raised, 1 abandoned, in 1.000 s"
    )
