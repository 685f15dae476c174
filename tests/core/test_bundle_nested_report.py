"""An inner bundle's report is kept when its caller is hard-cancelled.

A task waiting in ``inner.cancel(grace)`` that its own bundle's deadline
hard-cancels gets `trio.Cancelled`, not the inner report; the report goes to
that task's entry in its own bundle's report (`ChildEnd.reports`).
"""

from __future__ import annotations

import trio
import trio.testing

from trio_graceful import CancelReport, ChildEnd, ChildOutcome, open_bundle


def _times(report: CancelReport, t0: float) -> tuple[object, ...]:
    hard = report.hard_cancelled_at
    return (
        report.bundle,
        report.started_at - t0,
        report.finished_at - t0,
        report.hard_deadline - t0,
        None if hard is None else hard - t0,
    )


def _ends(report: CancelReport, t0: float) -> list[tuple[str, ChildOutcome, float]]:
    return [(c.name, c.outcome, c.ended_at - t0) for c in report.children]


async def _outer_cancels_a_waiting_worker(
    shutdown: bool,
) -> tuple[CancelReport, float]:
    async def worker() -> None:
        async with open_bundle(name="inner") as inner:
            inner.start_soon(trio.sleep_forever, name="stuck")
            inner.start_soon(trio.sleep, 2, name="quick")
            await trio.sleep(1)
            if shutdown:
                await inner.shutdown(grace=20)
            else:
                await inner.cancel(grace=20)

    t0 = trio.current_time()
    async with open_bundle(name="outer") as outer:
        outer.start_soon(worker, name="worker")
        await trio.testing.wait_all_tasks_blocked()
        report = await outer.cancel(grace=5)
    return report, t0


async def test_the_inner_report_is_kept_in_the_caller_entry(autojump_clock):
    report, t0 = await _outer_cancels_a_waiting_worker(shutdown=False)
    assert _times(report, t0) == ("outer", 0, 5, 5, 5)
    (end,) = report.children
    assert (end.name, end.outcome, end.ended_at - t0) == (
        "worker",
        ChildOutcome.CANCELLED,
        5,
    )
    (inner,) = end.reports
    # asked at 1 with 20 s of grace; its caller was hard-cancelled at 5
    assert _times(inner, t0) == ("inner", 1, 5, 21, 5)
    assert _ends(inner, t0) == [
        ("quick", ChildOutcome.FINISHED, 2),
        ("stuck", ChildOutcome.CANCELLED, 5),
    ]


async def test_the_inner_report_of_a_shutdown_is_kept_too(autojump_clock):
    report, t0 = await _outer_cancels_a_waiting_worker(shutdown=True)
    (inner,) = report.children[0].reports
    assert _times(inner, t0) == ("inner", 1, 5, 21, 5)


async def test_a_caller_that_was_not_cancelled_keeps_no_report(autojump_clock):
    async def worker() -> None:
        async with open_bundle(name="inner") as inner:
            inner.start_soon(trio.sleep, 1)
            await inner.cancel(grace=20)
        await trio.sleep_forever()

    async with open_bundle(name="outer") as outer:
        outer.start_soon(worker, name="worker")
        await trio.sleep(2)  # the inner cancel returned at 1
        report = await outer.cancel(grace=0)
    (end,) = report.children
    assert (end.outcome, end.reports) == (ChildOutcome.CANCELLED, ())


async def test_a_report_written_before_the_caller_was_cancelled_is_kept(
    autojump_clock,
):
    async def worker() -> None:
        async with open_bundle(name="inner") as inner:
            inner.start_soon(trio.sleep, 1, name="quick")
            await inner.cancel(grace=20)
            try:
                await trio.sleep_forever()
            finally:
                # still hard-cancelled: cancel() raises at its first checkpoint
                await inner.cancel(grace=20)

    t0 = trio.current_time()
    async with open_bundle(name="outer") as outer:
        outer.start_soon(worker, name="worker")
        await trio.sleep(2)
        report = await outer.cancel(grace=5)
    assert _times(report, t0) == ("outer", 2, 7, 7, 7)
    (end,) = report.children
    (inner,) = end.reports
    assert _times(inner, t0) == ("inner", 0, 1, 20, None)
    assert _ends(inner, t0) == [("quick", ChildOutcome.FINISHED, 1)]


async def test_the_kept_report_goes_to_json_and_back(autojump_clock):
    report, _ = await _outer_cancels_a_waiting_worker(shutdown=False)
    again = CancelReport.from_json(report.to_json())
    assert again == report
    assert again.children[0].reports == report.children[0].reports
    assert isinstance(again.children[0], ChildEnd)
