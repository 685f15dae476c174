"""Why a bundle's children were hard-cancelled: recorded where the cancel starts.

Each cause is checked with the time the report gives for it, exactly, under
the mock clock: the time of the hard cancel, not of the children's ends.
"""

from __future__ import annotations

import json
import sys

import pytest
import trio
import trio.testing

from trio_graceful import (
    CancelReport,
    ChildOutcome,
    HardCancelCause,
    TraceKind,
    open_bundle,
    record_trace,
)

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup


async def _slow_unwind() -> None:
    # Hard-cancelled, it takes 1 s more to end: the report must not take
    # the end of the child for the time of the hard cancel.
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            await trio.sleep(1)


async def test_a_grace_that_runs_out_is_recorded_at_the_deadline(autojump_clock):
    t0 = trio.current_time()
    async with open_bundle(name="b") as bundle:
        bundle.start_soon(_slow_unwind)
        await trio.sleep(2)
        report = await bundle.cancel(grace=3)
    assert report.hard_cancel_cause is HardCancelCause.GRACE_EXPIRED
    assert (report.hard_cancelled_at, report.finished_at) == (t0 + 5, t0 + 6)
    assert report.hard_deadline == t0 + 5


async def test_a_swallowed_cancel_at_the_deadline_is_the_grace_that_ran_out(
    autojump_clock,
):
    async def swallows():
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            return  # still counted as hard-cancelled

    t0 = trio.current_time()
    async with open_bundle(name="b") as bundle:
        bundle.start_soon(swallows)
        report = await bundle.cancel(grace=4)
    assert [c.outcome for c in report.children] == [ChildOutcome.CANCELLED]
    assert report.hard_cancel_cause is HardCancelCause.GRACE_EXPIRED
    assert report.hard_cancelled_at == t0 + 4


async def test_a_grace_of_zero_is_recorded_where_it_is_asked(autojump_clock):
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery, open_bundle(name="b") as bundle:
        bundle.start_soon(_slow_unwind)
        reports: list[CancelReport] = []

        async def wait_long() -> None:
            reports.append(await bundle.cancel(grace=10))

        nursery.start_soon(wait_long)
        await trio.sleep(2)
        # the runner forces a shutdown this way at a second signal
        report = await bundle.cancel(grace=0)
    assert reports == [report]
    assert report.hard_cancel_cause is HardCancelCause.NO_GRACE
    assert (report.hard_cancelled_at, report.hard_deadline) == (t0 + 2, t0 + 2)
    assert report.finished_at == t0 + 3


async def test_a_grace_of_zero_after_the_deadline_passed_changes_nothing(
    autojump_clock,
):
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery, open_bundle(name="b") as bundle:
        bundle.start_soon(_slow_unwind)
        nursery.start_soon(bundle.cancel, 1)
        await trio.sleep(1.5)  # the grace ran out; the child still unwinds
        report = await bundle.cancel(grace=0)
    assert report.hard_cancel_cause is HardCancelCause.GRACE_EXPIRED
    assert (report.hard_cancelled_at, report.hard_deadline) == (t0 + 1, t0 + 1)


async def test_a_cancelled_caller_is_recorded_when_it_was_cancelled(autojump_clock):
    t0 = trio.current_time()
    reports: list[CancelReport] = []

    async def wait_for_the_report(bundle):
        await trio.sleep(0.5)  # second: the first caller drives
        reports.append(await bundle.cancel(grace=100))

    async with trio.open_nursery() as nursery, open_bundle(name="b") as bundle:
        bundle.start_soon(_slow_unwind)
        nursery.start_soon(wait_for_the_report, bundle)
        with trio.move_on_after(1):
            await bundle.cancel(grace=100)
    (report,) = reports
    assert report.hard_cancel_cause is HardCancelCause.CALLER_CANCELLED
    assert (report.hard_cancelled_at, report.finished_at) == (t0 + 1, t0 + 2)
    assert report.hard_deadline == t0 + 100


async def test_a_raising_child_is_recorded_when_it_raised(autojump_clock):
    t0 = trio.current_time()
    reports: list[CancelReport] = []

    async def fails_during_the_grace():
        await trio.sleep(2)
        raise ValueError("no")

    async def wait_for_the_report(bundle):
        reports.append(await bundle.cancel(grace=10))

    async def run_the_bundle() -> None:
        async with trio.open_nursery() as nursery, open_bundle(name="b") as bundle:
            bundle.start_soon(fails_during_the_grace)
            bundle.start_soon(_slow_unwind)
            nursery.start_soon(wait_for_the_report, bundle)
            await trio.sleep_forever()

    with pytest.raises(BaseExceptionGroup):
        await run_the_bundle()
    (report,) = reports
    assert report.hard_cancel_cause is HardCancelCause.CHILD_RAISED
    assert (report.hard_cancelled_at, report.finished_at) == (t0 + 2, t0 + 3)


@pytest.mark.parametrize("by", ["cancel_scope", "enclosing scope"])
async def test_an_outside_cancel_is_recorded_by_the_first_child_it_ends(
    autojump_clock, by
):
    t0 = trio.current_time()
    reports: list[CancelReport] = []

    async def cancel_and_report(bundle):
        reports.append(await bundle.cancel(grace=10))

    with record_trace() as trace:
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as enclosing:
                async with open_bundle(name="b") as bundle:
                    bundle.start_soon(_slow_unwind)
                    nursery.start_soon(cancel_and_report, bundle)
                    await trio.sleep(3)
                    if by == "cancel_scope":
                        bundle.cancel_scope.cancel(reason="enough")
                    else:
                        enclosing.cancel(reason="enough")
                    await trio.sleep_forever()
    (report,) = reports
    assert report.hard_cancel_cause is HardCancelCause.CANCELLED_FROM_OUTSIDE
    # Nothing tells the bundle when it came: the child that ends first does.
    assert (report.hard_cancelled_at, report.finished_at) == (t0 + 4, t0 + 4)
    # Trio's own account of the cancel comes with it
    (hard,) = trace.of_kind(TraceKind.HARD_CANCEL)
    assert hard.detail is not None
    assert hard.detail.startswith(
        "cancelled from outside the bundle (its cancel_scope, or an enclosing "
        "scope): cancelled due to explicit with reason 'enough' from task "
    )


async def test_the_first_cause_is_the_one_reported(autojump_clock):
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery, open_bundle(name="b") as bundle:
        bundle.start_soon(_slow_unwind)
        nursery.start_soon(bundle.cancel, 2)
        await trio.sleep(2.5)  # the grace ran out at 2; the child unwinds
        with trio.move_on_after(0.25):  # a cancelled caller, then a grace of 0
            await bundle.cancel(grace=0)
        report = await bundle.cancel(grace=0)
    assert report.hard_cancel_cause is HardCancelCause.GRACE_EXPIRED
    assert report.hard_cancelled_at == t0 + 2


async def test_a_graceful_end_has_no_cause(autojump_clock):
    async with open_bundle(name="b") as bundle:
        bundle.start_soon(trio.sleep, 1)
        report = await bundle.cancel(grace=2)
    assert (report.hard_cancel_cause, report.hard_cancelled_at) == (None, None)
    assert json.loads(report.to_json())["hard_cancel_cause"] is None


async def test_the_cause_is_in_the_json_form(autojump_clock):
    async with open_bundle(name="b") as bundle:
        bundle.start_soon(trio.sleep_forever)
        report = await bundle.cancel(grace=0)
    data = json.loads(report.to_json())
    assert data["hard_cancel_cause"] == "no_grace"
    assert CancelReport.from_json(report.to_json()) == report
    with pytest.raises(
        ValueError, match=r"^hard_cancel_cause must be one of \['grace_expired', "
    ):
        CancelReport.from_dict({**data, "hard_cancel_cause": "tired"})
