"""The job worker under the mock clock: every ending of a job, at its exact time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import trio
import trio.testing

from tests.support.jobs import mock_store, serving, steps, stubborn
from trio_graceful import TraceKind, current_bundle, record_trace
from trio_graceful.jobs import (
    CallTimeoutError,
    JobContext,
    JobFunction,
    JobState,
    JobStore,
    Worker,
)

S = JobState


def make_worker(
    store: JobStore, functions: dict[str, JobFunction], **options: Any
) -> Worker:
    options.setdefault("poll_interval", 0.5)
    options.setdefault("worker_id", "w1")
    return Worker(store, functions, **options)


async def wait_for_state(store: JobStore, job_id: str, state: JobState) -> None:
    """Poll the store (virtual time) until the job is in ``state``."""
    # The store is the only shared view of a job, as for another process.
    while (await store.get(job_id)).state is not state:  # noqa: ASYNC110
        await trio.sleep(0.01)


async def wait_all_in_state(
    store: JobStore, job_ids: Sequence[str], state: JobState
) -> None:
    """`wait_for_state` for each of ``job_ids``, in turn."""
    for job_id in job_ids:
        await wait_for_state(store, job_id, state)


def audit(events: list[Any]) -> list[tuple[Any, Any, float]]:
    return [(e.source, e.target, e.at) for e in events]


async def test_completed_job_lists_the_calls_that_timed_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    errors: list[CallTimeoutError] = []

    async def provider_calls(ctx: JobContext) -> list[str]:
        done: list[str] = []
        for name, seconds in [("fast", 1), ("slow", 50), ("last", 2)]:
            try:
                with ctx.call_timeout(10, name=name):
                    await trio.sleep(seconds)
                done.append(name)
            except CallTimeoutError as exc:
                errors.append(exc)
                ctx.subtask_failed(name)
        return done

    store = mock_store()
    job_id = await store.submit("calls")
    worker = make_worker(store, {"calls": provider_calls})
    with record_trace() as trace:
        async with serving(worker):
            await wait_for_state(store, job_id, S.COMPLETED)
    job = await store.get(job_id)
    assert (job.result, job.failed_subtasks, job.elapsed, job.ended_at) == (
        ["fast", "last"],
        ("slow",),
        13,
        13,
    )
    assert audit(await store.events(job_id)) == [
        (None, S.QUEUED, 0),
        (S.QUEUED, S.RUNNING, 0),
        (S.RUNNING, S.COMPLETED, 13),
    ]
    details = [e.detail for e in trace.of_kind(TraceKind.STATE_CHANGED)]
    assert f"job {job_id}: queued -> running" in details
    assert f"job {job_id}: running -> completed" in details
    assert worker.statistics().ended == {"completed": 1}
    [error] = errors
    assert str(error) == "call 'slow' timed out after 10 s (limit 10 s)"
    assert (error.name, error.elapsed, error.limit) == ("slow", 10, 10)


async def test_a_job_that_raises_fails(autojump_clock: trio.testing.MockClock) -> None:
    async def broken(ctx: JobContext) -> None:
        await trio.sleep(2)
        raise ValueError("bad input")

    store = mock_store()
    job_id = await store.submit("broken")
    unknown = await store.submit("nope")
    async with serving(make_worker(store, {"broken": broken})):
        await wait_for_state(store, job_id, S.FAILED)
    job = await store.get(job_id)
    assert (job.error, job.ended_at) == ("raised ValueError('bad input')", 2)
    # Not this worker's kind: left queued for a worker that knows it.
    left = await store.get(unknown)
    assert (left.state, left.attempts, left.queued_at) == (S.QUEUED, 0, 0)
    assert left.waited(7.5) == 7.5


async def test_cooperative_cancel(autojump_clock: trio.testing.MockClock) -> None:
    store = mock_store()
    job_id = await store.submit("steps")
    async with serving(make_worker(store, {"steps": steps}, cancel_grace=5)):
        await trio.sleep(2.2)
        await store.request_cancel(job_id)
        await wait_for_state(store, job_id, S.CANCELLED)
    job = await store.get(job_id)
    # Seen by the poll at 2.5; the job stops at its next checkpoint, at 3.
    assert audit(await store.events(job_id))[-2:] == [
        (S.RUNNING, S.CANCELLING, 2.5),
        (S.CANCELLING, S.CANCELLED, 3),
    ]
    assert (job.progress, job.error, job.cancel_requested_at) == (
        {"step": 3},
        "cancelled cooperatively",
        2.2,
    )


async def test_forced_cancel_after_the_cancel_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cleanups: list[float] = []

    async def ignores_stop(ctx: JobContext) -> None:
        try:
            await stubborn(ctx)
        finally:
            cleanups.append(trio.current_time())

    store = mock_store()
    job_id = await store.submit("stubborn")
    async with serving(make_worker(store, {"stubborn": ignores_stop}, cancel_grace=5)):
        await trio.sleep(2.2)
        await store.request_cancel(job_id)
        await wait_for_state(store, job_id, S.CANCELLED)
    assert audit(await store.events(job_id))[-2:] == [
        (S.RUNNING, S.CANCELLING, 2.5),
        (S.CANCELLING, S.CANCELLED, 7.5),
    ]
    assert cleanups == [7.5]
    assert (await store.get(job_id)).error == "cancelled after a hard cancel"


async def test_a_job_that_finishes_its_work_while_cancelling_is_completed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def never_looks(ctx: JobContext) -> int:
        for k in range(1, 7):
            await trio.sleep(1)
            await ctx.report_progress({"step": k}, save_now=True)
        return 6

    store = mock_store()
    job_id = await store.submit("never_looks")
    seen: list[tuple[JobState, Any]] = []
    worker = make_worker(store, {"never_looks": never_looks}, cancel_grace=10)
    async with serving(worker):
        await trio.sleep(2.2)
        await store.request_cancel(job_id)
        for _ in range(3):
            await trio.sleep(1)
            job = await store.get(job_id)
            seen.append((job.state, job.progress))
        while not (await store.get(job_id)).state.terminal:  # noqa: ASYNC110
            await trio.sleep(0.01)
    # Its progress shows while the cancel request is served.
    assert seen == [
        (S.CANCELLING, {"step": 3}),
        (S.CANCELLING, {"step": 4}),
        (S.CANCELLING, {"step": 5}),
    ]
    job = await store.get(job_id)
    assert (job.state, job.result, job.error, job.progress) == (
        S.COMPLETED,
        6,
        None,
        {"step": 6},
    )
    events = await store.events(job_id)
    assert audit(events)[-2:] == [
        (S.RUNNING, S.CANCELLING, 2.5),
        (S.CANCELLING, S.COMPLETED, 6),
    ]
    assert events[-1].reason == "returned"
    assert worker.statistics().ended == {"completed": 1}


async def test_timeout_is_an_exact_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cleanups: list[float] = []

    async def slow(ctx: JobContext) -> None:
        try:
            await trio.sleep(100)
        finally:
            cleanups.append(trio.current_time())

    store = mock_store()
    await trio.sleep(1)
    job_id = await store.submit("slow", timeout=4.25)
    async with serving(make_worker(store, {"slow": slow})):
        await wait_for_state(store, job_id, S.TIMED_OUT)
    job = await store.get(job_id)
    assert audit(await store.events(job_id))[-2:] == [
        (S.RUNNING, S.TIMING_OUT, 5.25),
        (S.TIMING_OUT, S.TIMED_OUT, 5.25),
    ]
    assert (job.timed_out_at, job.elapsed, job.error) == (
        5.25,
        4.25,
        "timed out after 4.25 s",
    )
    assert cleanups == [5.25]


async def test_shutdown_hands_back_unfinished_jobs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def quick(ctx: JobContext) -> str:
        await trio.sleep(3)
        return "ok"

    store = mock_store()
    coop = await store.submit("steps")
    hard = await store.submit("stubborn")
    done = await store.submit("quick")
    waiting = await store.submit("steps")
    functions: dict[str, JobFunction] = {
        "steps": steps,
        "stubborn": stubborn,
        "quick": quick,
    }
    worker = make_worker(store, functions, concurrency=3, grace=5, lease=3)
    async with serving(worker):
        await trio.sleep(1.5)
    # serve() returned when the last job was settled.
    assert trio.current_time() == 6.5
    jobs = {job.id: job for job in await store.jobs()}
    assert [jobs[j].state for j in (coop, hard, done, waiting)] == [
        S.QUEUED,
        S.QUEUED,
        S.COMPLETED,
        S.QUEUED,
    ]
    assert (jobs[coop].progress, jobs[coop].handbacks, jobs[coop].attempts) == (
        {"step": 2},
        1,
        1,
    )
    assert audit(await store.events(coop))[-1] == (S.RUNNING, S.QUEUED, 2)
    assert audit(await store.events(hard))[-1] == (S.RUNNING, S.QUEUED, 6.5)
    assert (jobs[done].ended_at, jobs[waiting].attempts) == (3, 0)
    assert worker.statistics().ended == {"queued": 2, "completed": 1}
    assert await store.leases() == {}


async def test_the_lease_is_renewed_while_draining(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = mock_store()
    await store.submit("stubborn")
    worker = make_worker(store, {"stubborn": stubborn}, grace=10, lease=3)
    leases: list[dict[str, float]] = []
    async with trio.open_nursery() as nursery, serving(worker):
        await trio.sleep(1.5)

        async def look() -> None:
            await trio.sleep(8)
            leases.append(await store.leases())

        nursery.start_soon(look)
    # Renewed every second: at 9, the lease runs until 12.
    assert leases == [{"w1": 12.0}]


async def test_cancel_requests_are_served_while_draining(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = mock_store()
    job_id = await store.submit("stubborn")
    worker = make_worker(store, {"stubborn": stubborn}, grace=5)
    async with trio.open_nursery() as nursery, serving(worker):
        await trio.sleep(1)

        async def cancel_later() -> None:
            await trio.sleep(1.2)
            await store.request_cancel(job_id)

        nursery.start_soon(cancel_later)
    job = await store.get(job_id)
    assert (job.state, job.ended_at) == (S.CANCELLED, 6)
    assert audit(await store.events(job_id))[-2:] == [
        (S.RUNNING, S.CANCELLING, 6),
        (S.CANCELLING, S.CANCELLED, 6),
    ]


async def test_a_dead_workers_job_is_rescued_and_resumed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = mock_store()
    job_id = await store.submit("steps", {"steps": 5})
    await store.claim("dead", lease=2)
    await store.save_progress(job_id, {"step": 3}, worker="dead", attempt=1)
    await trio.sleep(2)
    async with serving(make_worker(store, {"steps": steps})):
        await wait_for_state(store, job_id, S.COMPLETED)
    job = await store.get(job_id)
    assert (job.attempts, job.progress, job.worker, job.result) == (
        2,
        {"step": 5},
        "w1",
        5,
    )
    assert job.ended_at == 4
    assert [(e.target, e.worker) for e in await store.events(job_id)] == [
        (S.QUEUED, None),
        (S.RUNNING, "dead"),
        (S.QUEUED, "w1"),
        (S.RUNNING, "w1"),
        (S.COMPLETED, "w1"),
    ]


async def test_progress_saves_are_throttled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    saved: list[Any] = []

    async def chatty(ctx: JobContext) -> None:
        for k in range(40):
            await trio.sleep(0.1)
            await ctx.report_progress({"k": k})
            saved.append((await store.get(ctx.job.id)).progress)

    store = mock_store()
    job_id = await store.submit("chatty")
    async with serving(make_worker(store, {"chatty": chatty}, heartbeat_interval=1)):
        await wait_for_state(store, job_id, S.COMPLETED)
    distinct = [p for i, p in enumerate(saved) if i == 0 or saved[i - 1] != p]
    assert len(distinct) == 4
    assert (await store.get(job_id)).progress == {"k": 39}


def test_bad_worker_options() -> None:
    store = mock_store()
    with pytest.raises(ValueError, match=r"^concurrency must be >= 1, not 0$"):
        Worker(store, {"k": stubborn}, concurrency=0)
    with pytest.raises(ValueError, match=r"^grace must be >= 0, not -1$"):
        Worker(store, {"k": stubborn}, grace=-1)
    with pytest.raises(ValueError, match=r"^lease must be a finite number > 0, not 0$"):
        Worker(store, {"k": stubborn}, lease=0)


async def test_a_worker_that_lost_its_job_writes_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = mock_store()
    job_id = await store.submit("stubborn")
    worker = make_worker(store, {"stubborn": stubborn}, concurrency=1, grace=1)
    async with serving(worker):
        await trio.sleep(1)
        # As if the worker had stalled past its lease: another worker
        # rescues the job while this one still runs it.
        await store.drop_lease("w1")
        [rescued] = await store.rescue(rescuer="r")
        assert rescued.state is S.QUEUED
    job = await store.get(job_id)
    # The hand-back at the shutdown was refused: the rescue stands alone.
    assert (job.state, job.handbacks, job.attempts) == (S.QUEUED, 0, 1)
    assert audit(await store.events(job_id))[-1] == (S.RUNNING, S.QUEUED, 1)
    assert worker.statistics().ended == {"lost": 1}


async def test_each_job_runs_as_a_child_of_its_own_bundle_one_after_another(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen: list[tuple[str, bool, trio.lowlevel.Task]] = []

    async def where(ctx: JobContext) -> None:
        bundle = current_bundle()
        # The task that opened the job's bundle: the worker's slot.
        seen.append(
            (bundle.name, trio.lowlevel.current_task() in bundle, bundle.parent_task)
        )
        await trio.sleep(1)

    store = mock_store()
    ids = [await store.submit("where") for _ in range(3)]
    async with serving(make_worker(store, {"where": where}, concurrency=1)):
        await wait_for_state(store, ids[-1], S.COMPLETED)
    assert [(name, child) for name, child, _ in seen] == [
        (f"job {job_id}", True) for job_id in ids
    ]
    # Each settlement claimed the next job, which ran in the same task.
    assert len({slot for _, _, slot in seen}) == 1
    assert [(await store.get(job_id)).ended_at for job_id in ids] == [1, 2, 3]


async def test_a_subtask_that_raises_fails_its_job_and_not_the_worker(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def broken_subtask() -> None:
        await trio.sleep(1)
        raise ValueError("subtask broke")

    async def with_subtask(ctx: JobContext) -> str:
        current_bundle().start_soon(broken_subtask)
        await trio.sleep(5)
        return "never"

    store = mock_store()
    failing = await store.submit("with subtask")
    after = await store.submit("quick")
    functions: dict[str, JobFunction] = {
        "with subtask": with_subtask,
        "quick": returns_at_once,
    }
    worker = make_worker(store, functions, concurrency=1)
    async with serving(worker):
        await wait_for_state(store, after, S.COMPLETED)
    job = await store.get(failing)
    assert (job.state, job.error, job.ended_at) == (
        S.FAILED,
        "a subtask raised ValueError('subtask broke')",
        1,
    )
    assert job.traceback is not None
    assert "ValueError: subtask broke" in job.traceback
    assert (await store.get(after)).ended_at == 1
    assert worker.statistics().ended == {"failed": 1, "completed": 1}


async def returns_at_once(ctx: JobContext) -> None:
    await trio.lowlevel.checkpoint()


async def test_subtasks_that_stop_as_asked_hand_their_job_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def stepping(ctx: JobContext) -> None:
        while True:
            await ctx.checkpoint()  # raises JobStopped once asked to stop
            await trio.sleep(1)

    async def with_subtasks(ctx: JobContext) -> None:
        for _ in range(2):
            current_bundle().start_soon(stepping, ctx)
        await ctx.wait_stop()

    store = mock_store()
    job_id = await store.submit("with subtasks")
    worker = make_worker(store, {"with subtasks": with_subtasks}, grace=5)
    async with serving(worker):
        await trio.sleep(2.5)
    job = await store.get(job_id)
    # STOP at 2.5; each subtask stops at its next checkpoint, at 3.
    assert (job.state, job.handbacks, job.error) == (S.QUEUED, 1, None)
    assert audit(await store.events(job_id))[-1] == (S.RUNNING, S.QUEUED, 3)
    assert worker.statistics().ended == {"queued": 1}


async def test_a_timeout_of_a_job_rescued_meanwhile_writes_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = mock_store()
    job_id = await store.submit("stubborn", timeout=3)
    after = await store.submit("quick")
    functions: dict[str, JobFunction] = {
        "stubborn": stubborn,
        "quick": returns_at_once,
    }
    worker = make_worker(store, functions, concurrency=1, lease=30)
    async with serving(worker):
        await trio.sleep(1)
        # As if the worker had stalled past its lease: another worker rescues
        # the job, and this one's ``timing_out`` at 3 is refused.
        await store.drop_lease("w1")
        [rescued] = await store.rescue(rescuer="r")
        assert rescued.state is S.QUEUED
        await trio.sleep(3)
        # The worker is alive and claims again: the rescued job first.
        await wait_for_state(store, after, S.COMPLETED)
    events = audit(await store.events(job_id))
    assert (S.RUNNING, S.TIMING_OUT, 3) not in events
    assert events[2] == (S.RUNNING, S.QUEUED, 1)
    assert worker.statistics().ended["lost"] == 1


async def swallowing(ctx: JobContext) -> None:
    """Catches every Exception around its checkpoints, as careless jobs do."""
    while True:
        try:
            await ctx.checkpoint()
        except Exception as exc:
            swallowed.append(exc)
        try:
            await trio.sleep(1)
        except trio.Cancelled:
            hard_cancelled.append(trio.current_time())
            raise


#: What `swallowing` caught, and when it was hard-cancelled.
swallowed: list[Exception] = []
hard_cancelled: list[float] = []


async def test_except_exception_around_a_checkpoint_does_not_swallow_stop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hard_cancelled.clear()
    swallowed.clear()
    store = mock_store()
    job_id = await store.submit("swallowing")
    worker = make_worker(store, {"swallowing": swallowing}, grace=10)
    async with serving(worker):
        await trio.sleep(2.5)
    # STOP at 2.5; the job stops at its next checkpoint, at 3, well within
    # the grace, and is handed back without a hard cancel.
    job = await store.get(job_id)
    assert (job.state, job.handbacks, job.error) == (S.QUEUED, 1, None)
    assert audit(await store.events(job_id))[-1] == (S.RUNNING, S.QUEUED, 3)
    assert (swallowed, hard_cancelled) == ([], [])


async def test_except_exception_around_a_checkpoint_does_not_swallow_a_cancel(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hard_cancelled.clear()
    swallowed.clear()
    store = mock_store()
    job_id = await store.submit("swallowing")
    worker = make_worker(store, {"swallowing": swallowing}, cancel_grace=10)
    async with serving(worker):
        await trio.sleep(2.5)
        await store.request_cancel(job_id)
        await wait_for_state(store, job_id, S.CANCELLED)
    events = await store.events(job_id)
    assert (events[-1].target, events[-1].reason) == (
        S.CANCELLED,
        "cancelled cooperatively",
    )
    assert events[-1].at < 5
    assert (swallowed, hard_cancelled) == ([], [])


async def test_a_subtask_that_fails_as_others_stop_fails_the_job_naming_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def stepping(ctx: JobContext) -> None:
        while True:
            await ctx.checkpoint()  # raises JobStopped once asked to stop
            await trio.sleep(1)

    async def fails_at_stop(ctx: JobContext) -> None:
        await ctx.wait_stop()
        raise ValueError("cleanup failed")

    async def mixed(ctx: JobContext) -> None:
        current_bundle().start_soon(stepping, ctx)
        current_bundle().start_soon(fails_at_stop, ctx)
        await ctx.wait_stop()

    store = mock_store()
    job_id = await store.submit("mixed")
    worker = make_worker(store, {"mixed": mixed}, grace=5)
    async with serving(worker):
        await trio.sleep(2.5)
    job = await store.get(job_id)
    assert (job.state, job.error) == (
        S.FAILED,
        "a subtask raised ValueError('cleanup failed')",
    )
    assert worker.statistics().ended == {"failed": 1}
