"""A worker's job functions: checked at construction, claimed by kind, tracebacks kept.

The checks and the exact-time tests run on SQLite under the mock clock;
the mixed fleet and the stored tracebacks run on SQLite and on a real
PostgreSQL, with the stores' queries in the Trio thread so that the mock
clock still drives the workers.
"""

from __future__ import annotations

import datetime
import functools
import logging
import math
import re
from collections.abc import Awaitable
from typing import Any

import pytest
import trio
import trio.testing

from tests.support.jobs import mock_store, serving, stubborn
from trio_graceful.jobs import (
    JobContext,
    JobEvent,
    JobState,
    JobStore,
    Worker,
    open_store,
)
from trio_graceful.jobs._traceback import HEAD, TAIL

S = JobState


async def plain(ctx: JobContext) -> str:
    return ctx.job.kind


async def scaled(ctx: JobContext, *, factor: int) -> int:
    return int(ctx.job.payload["n"]) * factor


NOT_ASYNC = (
    r"the function of job kind '{}' must be an async function \(async def\), not "
)


def sync(ctx: JobContext) -> None:
    """Not async at all."""


def returns_a_coroutine(ctx: JobContext) -> Awaitable[str]:
    """Returns an awaitable, but ``inspect`` cannot tell: refused."""
    return plain(ctx)


class Job:
    """A callable object whose ``__call__`` is async."""

    async def __call__(self, ctx: JobContext) -> str:
        return "called"

    async def method(self, ctx: JobContext) -> str:
        return "method"


async def wait_until_ended(store: JobStore, *job_ids: str) -> None:
    """Poll the store (virtual time) until every job has ended."""
    while not all(job.state.terminal for job in await store.jobs(job_ids)):  # noqa: ASYNC110
        await trio.sleep(0.01)


# (functions, the exception, the whole message as a regular expression)
BAD_FUNCTIONS: list[tuple[Any, type[Exception], str]] = [
    (
        [],
        TypeError,
        r"functions must be a mapping of job kind to async function, not \[\]",
    ),
    ({}, ValueError, "functions must name at least one job kind"),
    ({1: plain}, TypeError, "job kind must be a string, not 1"),
    ({"": plain}, ValueError, "job kind must not be empty"),
    (
        {"a\0": plain},
        ValueError,
        r"job kind must be text without NUL or lone surrogates, not 'a\\x00'",
    ),
    (
        {"a": sync},
        TypeError,
        NOT_ASYNC.format("a") + r"<function sync at 0x\w+>",
    ),
    (
        {"a": plain, "b": returns_a_coroutine},
        TypeError,
        NOT_ASYNC.format("b") + r"<function returns_a_coroutine at 0x\w+>",
    ),
    (
        {"a": Job},
        TypeError,
        NOT_ASYNC.format("a") + r"<class '.*\.Job'>",
    ),
]


@pytest.mark.parametrize(("functions", "error", "message"), BAD_FUNCTIONS)
def test_bad_functions_are_refused_at_construction(
    functions: Any, error: type[Exception], message: str
) -> None:
    store = mock_store()
    with pytest.raises(error, match=f"^{message}$"):
        Worker(store, functions)


def test_a_bad_worker_id_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match=r"^worker_id must not be empty$"):
        Worker(mock_store(), {"a": plain}, worker_id="")
    with pytest.raises(TypeError, match=r"^worker_id must be a string, not 7$"):
        Worker(mock_store(), {"a": plain}, worker_id=7)  # type: ignore[arg-type]


async def test_partials_methods_and_async_callables_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = mock_store()
    functions = {
        "partial": functools.partial(scaled, factor=3),
        "method": Job().method,
        "callable": Job(),
    }
    ids = [await store.submit(kind, {"n": 2}) for kind in functions]
    async with serving(Worker(store, functions, poll_interval=0.5)):
        await wait_until_ended(store, *ids)
    assert [(await store.get(i)).result for i in ids] == [6, "method", "called"]


def test_the_functions_are_a_read_only_copy() -> None:
    functions = {"a": plain}
    worker = Worker(mock_store(), functions)
    functions["b"] = plain
    assert list(worker.functions) == ["a"]
    with pytest.raises(TypeError):
        worker.functions["b"] = plain  # type: ignore[index]


async def test_a_mixed_fleet_runs_each_kind_on_the_worker_that_knows_it(
    store_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    with (
        open_store(store_url, offload=False) as one,
        open_store(store_url, offload=False) as two,
        open_store(store_url, offload=False) as client,
    ):
        ids: dict[str, list[str]] = {}
        for kind in "abc":  # a loop: Python 3.10 has no await in a nested comprehension
            ids[kind] = [await client.submit(kind) for _ in range(3)]
        older = Worker(one, {"a": plain}, worker_id="A", poll_interval=0.5)
        newer = Worker(two, {"a": plain, "b": plain}, worker_id="B", poll_interval=0.5)
        async with serving(older), serving(newer):
            await wait_until_ended(client, *ids["a"], *ids["b"])
            # Nobody knows "c": its jobs wait, unclaimed and unfailed.
            await trio.sleep(10)
        for job_id in ids["b"]:
            assert (await client.get(job_id)).worker == "B"
        assert {(await client.get(i)).state for i in ids["a"] + ids["b"]} == {
            S.COMPLETED
        }
        for job_id in ids["c"]:
            job = await client.get(job_id)
            assert (job.state, job.attempts, job.worker) == (S.QUEUED, 0, None)
            assert job.queued_at == job.created_at
            waited = job.waited(client.now())
            assert waited is not None
            assert waited >= 0
            assert [e.target for e in await client.events(job_id)] == [S.QUEUED]
        async with serving(Worker(one, {"c": plain}, worker_id="C")):
            await wait_until_ended(client, *ids["c"])
        assert {(await client.get(i)).worker for i in ids["c"]} == {"C"}


async def test_waited_counts_from_the_hand_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = mock_store()
    job_id = await store.submit("stubborn")
    assert (await store.get(job_id)).waited(3) == 3
    async with serving(Worker(store, {"stubborn": stubborn}, grace=1)):
        await trio.sleep(4)
        job = await store.get(job_id)
        assert (job.state, job.queued_at, job.waited(4)) == (S.RUNNING, None, None)
    job = await store.get(job_id)
    # STOP at 4, the grace ran out at 5: handed back then.
    assert (job.state, job.queued_at, job.waited(12)) == (S.QUEUED, 5, 7)
    assert job.as_json(now=12)["waited"] == 7


def deep_failure(n: int) -> None:
    if n:
        deep_failure(n - 1)
    raise ValueError("bad input")


async def test_a_failing_job_keeps_its_traceback_and_logs_it(
    store_url: str,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(ctx: JobContext) -> None:
        await trio.sleep(1)
        deep_failure(2)

    with open_store(store_url, offload=False) as store:
        job_id = await store.submit("broken")
        fine = await store.submit("fine")
        worker = Worker(store, {"broken": broken, "fine": plain}, worker_id="w1")
        async with serving(worker):
            await wait_until_ended(store, job_id, fine)
        job = await store.get(job_id)
        assert job.error == "raised ValueError('bad input')"
        assert job.traceback is not None
        assert job.traceback.startswith("Traceback (most recent call last):\n")
        assert job.traceback.count("in deep_failure") == 3
        assert job.traceback.endswith("\nValueError: bad input\n")
        assert job.as_json(now=store.now())["traceback"] == job.traceback
        assert (await store.get(fine)).traceback is None
    [record] = [r for r in caplog.records if r.name == "trio_graceful.jobs"]
    assert (record.levelno, record.getMessage()) == (
        logging.WARNING,
        f"worker w1: job {job_id} (broken) failed: raised ValueError('bad input')",
    )
    assert record.exc_info is not None
    assert str(record.exc_info[1]) == "bad input"


async def test_a_huge_traceback_is_cut_and_made_storable(
    store_url: str,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def loud(ctx: JobContext) -> None:
        raise RuntimeError("x" * 50_000 + "\0 and \udc80 end")

    # The log line holds the lone surrogate as it is; a test report that
    # carried it could not be sent between test processes.
    caplog.set_level(logging.ERROR, logger="trio_graceful.jobs")

    with open_store(store_url, offload=False) as store:
        job_id = await store.submit("loud")
        async with serving(Worker(store, {"loud": loud})):
            await wait_until_ended(store, job_id)
        job = await store.get(job_id)
    assert job.state is S.FAILED
    assert job.traceback is not None
    head, marker, tail = job.traceback.partition(" characters left out ...]\n")
    assert marker
    assert re.fullmatch(r"(?s)Traceback .*\n\[\.\.\. \d+", head)
    assert len(head) < HEAD + 20
    assert tail == job.traceback[-TAIL:]
    assert tail.endswith("x\\x00 and \\udc80 end\n")


async def test_a_result_or_progress_that_is_not_json_fails_the_job(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def dated(ctx: JobContext) -> dict[str, Any]:
        return {"when": [datetime.date(2026, 1, 1)]}

    async def not_a_number(ctx: JobContext) -> None:
        await ctx.report_progress({"ratio": math.nan})

    store = mock_store()
    dated_id = await store.submit("dated")
    nan_id = await store.submit("nan")
    worker = Worker(store, {"dated": dated, "nan": not_a_number})
    async with serving(worker):
        await wait_until_ended(store, dated_id, nan_id)
    job = await store.get(dated_id)
    assert (job.state, job.result, job.error) == (
        S.FAILED,
        None,
        """raised TypeError('result["when"][0]: date is not JSON')""",
    )
    assert job.traceback is not None
    assert job.traceback.endswith('TypeError: result["when"][0]: date is not JSON\n')
    job = await store.get(nan_id)
    assert (job.state, job.progress, job.error) == (
        S.FAILED,
        None,
        """raised ValueError('progress["ratio"]: nan is not JSON """
        """(no NaN or infinity)')""",
    )


async def test_finish_then_claim_keeps_the_traceback_and_claims_by_kind(
    store_url: str,
) -> None:
    # The settlement of a worker's job claims the next ones in the same
    # trip: only of the worker's kinds, with the ending's traceback stored.
    with open_store(store_url, offload=False) as store:
        one, other, two = [await store.submit(kind) for kind in "aba"]
        claimed = await store.claim("w", lease=10, kinds=["a"])
        assert claimed is not None
        first = claimed.id
        [second] = {one, two} - {first}
        options: dict[str, Any] = {
            "worker": "w",
            "attempt": 1,
            "reason": "raised",
            "limit": 2,
            "lease": 10,
            "stale_after": None,
            "incarnation": None,
        }
        with pytest.raises(ValueError, match=r"^kinds must name at least one job"):
            await store.finish_then_claim(first, JobEvent.FAIL, kinds=[], **options)
        assert (await store.get(first)).state is S.RUNNING
        job, jobs = await store.finish_then_claim(
            first, JobEvent.FAIL, traceback="Traceback: a\n", kinds=["a"], **options
        )
        assert (job.state, job.traceback) == (S.FAILED, "Traceback: a\n")
        assert jobs is not None
        assert [j.id for j in jobs] == [second]
        assert (await store.get(other)).state is S.QUEUED
