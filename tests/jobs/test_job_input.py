"""Bad input is refused at the call, with the same error on SQLite and PostgreSQL.

Each case runs against a real store of each kind and asserts the exception
type, its whole message, and that nothing was written. A value both stores
can hold (the largest ``max_attempts``, the largest timeout) is accepted
and read back unchanged.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from trio_graceful.jobs import (
    JobEvent,
    JobNotFoundError,
    JobState,
    JobStore,
    StoreError,
    open_store,
)

Call = Callable[[JobStore], Awaitable[object]]

BIG = 2**1024  # beyond any float

# (what is called, the exception, its whole message)
SUBMIT_CASES: list[tuple[Call, type[Exception], str]] = [
    (lambda s: s.submit(""), ValueError, "kind must not be empty"),
    (lambda s: s.submit(1), TypeError, "kind must be a string, not 1"),  # type: ignore[arg-type]
    (
        lambda s: s.submit("a\0b"),
        ValueError,
        r"kind must be text without NUL or lone surrogates, not 'a\x00b'",
    ),
    (
        lambda s: s.submit("\ud800"),
        ValueError,
        r"kind must be text without NUL or lone surrogates, not '\ud800'",
    ),
    (
        lambda s: s.submit("k", max_attempts=2**63),
        ValueError,
        "max_attempts must be in 1..2147483647, not 9223372036854775808",
    ),
    (
        lambda s: s.submit("k", max_attempts=2**31),
        ValueError,
        "max_attempts must be in 1..2147483647, not 2147483648",
    ),
    (
        lambda s: s.submit("k", max_attempts=0),
        ValueError,
        "max_attempts must be in 1..2147483647, not 0",
    ),
    (
        lambda s: s.submit("k", max_attempts=True),
        TypeError,
        "max_attempts must be an int, not True",
    ),
    (
        lambda s: s.submit("k", timeout=BIG),
        ValueError,
        f"timeout must be a finite number > 0, not {BIG}",
    ),
    (
        lambda s: s.submit("k", timeout=math.nan),
        ValueError,
        "timeout must be a finite number > 0, not nan",
    ),
    (
        lambda s: s.submit("work", [1, 2]),  # type: ignore[arg-type]
        TypeError,
        "payload must be a mapping with string keys (a JSON object), not [1, 2]",
    ),
    (
        lambda s: s.submit("k", {"when": datetime.datetime(2026, 1, 1)}),
        TypeError,
        'payload["when"]: datetime is not JSON',
    ),
    (
        lambda s: s.submit("k", {1: "a"}),  # type: ignore[dict-item]
        TypeError,
        "payload: key 1 is not a string",
    ),
    (
        lambda s: s.submit("k", {"x": [1, math.nan]}),
        ValueError,
        'payload["x"][1]: nan is not JSON (no NaN or infinity)',
    ),
    (
        lambda s: s.submit("k", {"x": {"y": -math.inf}}),
        ValueError,
        'payload["x"]["y"]: -inf is not JSON (no NaN or infinity)',
    ),
    (
        lambda s: s.submit("k", {"t": (1, 2)}),
        TypeError,
        'payload["t"]: tuple is not JSON',
    ),
]

READ_CASES: list[tuple[Call, type[Exception], str]] = [
    (lambda s: s.request_cancel(123), TypeError, "job_id must be a string, not 123"),  # type: ignore[arg-type]
    (lambda s: s.request_cancel("nope"), JobNotFoundError, "no job with id 'nope'"),
    (lambda s: s.request_cancel("a\0"), JobNotFoundError, r"no job with id 'a\x00'"),
    (lambda s: s.get(None), TypeError, "job_id must be a string, not None"),  # type: ignore[arg-type]
    (lambda s: s.get("nope"), JobNotFoundError, "no job with id 'nope'"),
    (
        lambda s: s.jobs("abc"),
        TypeError,
        "ids must be a sequence of job ids, not 'abc'",
    ),
    (lambda s: s.jobs([7]), TypeError, "job_id must be a string, not 7"),  # type: ignore[list-item]
    (lambda s: s.events("nope"), JobNotFoundError, "no job with id 'nope'"),
    (lambda s: s.events(b"x"), TypeError, "job_id must be a string, not b'x'"),  # type: ignore[arg-type]
    (
        lambda s: s.claim("w", lease=0),
        ValueError,
        "lease must be a finite number > 0, not 0",
    ),
    (lambda s: s.claim("", lease=1), ValueError, "worker must not be empty"),
    (
        lambda s: s.claim("w", lease=1, stale_after=-1),
        ValueError,
        "stale_after must be >= 0, not -1",
    ),
    (
        lambda s: s.claim("w", lease=1, kinds=[]),
        ValueError,
        "kinds must name at least one job kind, or be None for any",
    ),
    (
        lambda s: s.claim("w", lease=1, kinds="abc"),
        TypeError,
        "kinds must be a collection of job kinds or None, not 'abc'",
    ),
    (
        lambda s: s.claim("w", lease=1, kinds=["a\0"]),
        ValueError,
        r"kind must be text without NUL or lone surrogates, not 'a\x00'",
    ),
    (
        lambda s: s.renew_lease("w", lease=math.inf),
        ValueError,
        "lease must be a finite number > 0, not inf",
    ),
    (lambda s: s.drop_lease(5), TypeError, "worker must be a string, not 5"),  # type: ignore[arg-type]
    (lambda s: s.rescue(rescuer=""), ValueError, "rescuer must not be empty"),
    (
        lambda s: s.wait_for_news(-1),
        ValueError,
        "timeout must be a finite number > 0, not -1",
    ),
]


async def nothing_written(store: JobStore) -> bool:
    return (await store.jobs(), await store.events(), await store.leases()) == (
        [],
        [],
        {},
    )


async def refused(
    store: JobStore, call: Call, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as caught:
        await call(store)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    "cases", [SUBMIT_CASES, READ_CASES], ids=["submit", "other calls"]
)
async def test_bad_input_is_refused_and_nothing_is_written(
    store_url: str, cases: list[tuple[Call, type[Exception], str]]
) -> None:
    with open_store(store_url) as store:
        for call, error, message in cases:
            await refused(store, call, error, message)
            assert await nothing_written(store), message


async def test_bad_progress_and_attempts_of_a_running_job(store_url: str) -> None:
    with open_store(store_url) as store:
        job_id = await store.submit("k")
        await store.claim("w", lease=60)
        bad: list[tuple[Any, type[Exception], str]] = [
            (
                [1],
                TypeError,
                "progress must be a mapping with string keys (a JSON object), not [1]",
            ),
            (
                {"x": math.nan},
                ValueError,
                'progress["x"]: nan is not JSON (no NaN or infinity)',
            ),
            ({"s": {1, 2}}, TypeError, 'progress["s"]: set is not JSON'),
        ]
        for progress, error, message in bad:
            call: Call = lambda s, p=progress: s.save_progress(  # noqa: E731
                job_id, p, worker="w", attempt=1
            )
            await refused(store, call, error, message)
        await refused(
            store,
            lambda s: s.save_progress(job_id, {}, worker="w", attempt=2**31),
            ValueError,
            "attempt must be in 1..2147483647, not 2147483648",
        )
        job = await store.get(job_id)
        assert (job.progress, job.last_heartbeat_at) == (None, None)


async def test_the_largest_values_both_stores_hold(store_url: str) -> None:
    payload: dict[str, Any] = {
        "big": 2**100,
        "tiny": 5e-324,
        "nul": "a\0b",
        "lone": "\udc80",
        "deep": [[[{"": None, "é": True}]]],
        "neg0": -0.0,
    }
    with open_store(store_url) as store:
        job_id = await store.submit(
            "k" * 1000, payload, timeout=1.7e308, max_attempts=2**31 - 1
        )
        job = await store.get(job_id)
        assert (job.kind, job.payload, job.timeout, job.max_attempts) == (
            "k" * 1000,
            payload,
            1.7e308,
            2**31 - 1,
        )
        assert math.copysign(1, job.payload["neg0"]) == -1


async def test_a_transition_sets_only_the_columns_a_worker_may(
    store_url: str,
) -> None:
    message = (
        "a transition cannot set attempts, state; it sets only "
        "elapsed, error, failed_subtasks, progress, result"
    )
    options: dict[str, Any] = {"worker": "w", "attempt": 1, "reason": "r"}
    with open_store(store_url) as store:
        job_id = await store.submit("k")
        await store.claim("w", lease=60)
        events = await store.events()
        await refused(
            store,
            lambda s: s.finish(
                job_id, JobEvent.COMPLETE, attempts=5, state="queued", **options
            ),
            TypeError,
            message,
        )
        await refused(
            store,
            lambda s: s.finish_then_claim(
                job_id,
                JobEvent.COMPLETE,
                state="queued",
                attempts=5,
                limit=1,
                lease=60,
                stale_after=None,
                incarnation=None,
                **options,
            ),
            TypeError,
            message,
        )
        assert await store.events() == events
        assert (await store.get(job_id)).state is JobState.RUNNING


class LooksLikeResult(str):
    """A keyword name that compares and hashes as ``result``, but reads as SQL."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return other == "result" or str.__eq__(self, other)

    def __hash__(self) -> int:
        return hash("result")


async def test_no_keyword_name_of_a_caller_reaches_the_sql(store_url: str) -> None:
    # As SQL: "result = NULL, state = ?", with the value 'queued'.
    sneaky = LooksLikeResult("result = NULL, state")
    with open_store(store_url) as store:
        job_id = await store.submit("k")
        await store.claim("w", lease=60)
        events = await store.events()
        await refused(
            store,
            lambda s: s.finish(
                job_id,
                JobEvent.COMPLETE,
                worker="w",
                attempt=1,
                reason="r",
                **{sneaky: "queued"},
            ),
            TypeError,
            "a transition cannot set 'result = NULL, state'; "
            "it sets only elapsed, error, failed_subtasks, progress, result",
        )
        assert await store.events() == events
        assert (await store.get(job_id)).state is JobState.RUNNING


async def test_a_with_block_closes_the_store(store_url: str) -> None:
    opened = open_store(store_url)
    with opened as store:
        assert store is opened
        assert await store.jobs() == []
    with pytest.raises(StoreError, match=r"^the job store is closed$"):
        await store.jobs()


async def test_a_closed_store_refuses_every_operation(store_url: str) -> None:
    store = open_store(store_url)
    job_id = await store.submit("k")
    store.close()
    store.close()  # closing again does nothing
    calls: list[Call] = [
        lambda s: s.submit("k"),
        lambda s: s.claim("w", lease=1),
        lambda s: s.get(job_id),
        lambda s: s.jobs(),
        lambda s: s.events(),
        lambda s: s.request_cancel(job_id),
        lambda s: s.cancel_requests("w"),
        lambda s: s.save_progress(job_id, {}, worker="w", attempt=1),
        lambda s: s.renew_lease("w", lease=1),
        lambda s: s.drop_lease("w"),
        lambda s: s.leases(),
        lambda s: s.rescue(rescuer="r"),
        lambda s: s.finish(
            job_id, JobEvent.COMPLETE, worker="w", attempt=1, reason="done"
        ),
    ]
    for call in calls:
        with pytest.raises(
            StoreError, match=f"^{re.escape('the job store is closed')}$"
        ):
            await call(store)
    if store.listens:
        with pytest.raises(StoreError, match=r"^the job store is closed$"):
            await store.wait_for_news(1)
