"""A group of endings writes what the same endings, one at a time, would write.

For endings that end their jobs (completed or failed), some refused (an
attempt the worker does not hold), each with a claim of its own: one group
transaction and one transaction per ending, in the same order, leave the
same states, the same claims for each ending, and the same refusals.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings, strategies as st

from trio_graceful.jobs import (
    IllegalJobTransitionError,
    JobEvent,
    JobState,
    LostJobError,
    _client,
    _holding,
)
from trio_graceful.jobs._holding import ClaimRequest, GroupedEnding
from trio_graceful.jobs._records import JobEnding
from trio_graceful.jobs._sql import Database
from trio_graceful.jobs._sqlite import SQLiteConnection

RUNNING, QUEUED = 6, 6
# Per ending: which running job, completed or failed, held or not, claim limit.
ENDINGS = st.lists(
    st.tuples(
        st.integers(0, RUNNING - 1),
        st.sampled_from([JobEvent.COMPLETE, JobEvent.FAIL]),
        st.booleans(),
        st.integers(0, 3),
    ),
    max_size=8,
)


def store() -> tuple[Database, list[str]]:
    """Jobs 0..RUNNING-1 running under worker "w", the rest queued, in order."""
    db = Database(SQLiteConnection(":memory:"))
    ids = [
        _client.submit(db, "k", {}, timeout=None, max_attempts=3, now=float(k))
        for k in range(RUNNING + QUEUED)
    ]
    claimed = _holding.claim_many(
        db, "w", now=100.0, lease=30, stale_after=None, incarnation="i", limit=RUNNING
    )
    assert [job.id for job in claimed] == ids[:RUNNING]
    return db, ids


def members(ids: list[str], endings: Any) -> list[GroupedEnding]:
    return [
        GroupedEnding(
            JobEnding(
                job_id=ids[k],
                event=event,
                worker="w",
                attempt=1 if held else 2,
                reason="r",
            ),
            200.0,
            ClaimRequest(
                limit=limit, lease=30, stale_after=None, incarnation="i", kinds=None
            ),
        )
        for k, event, held, limit in endings
    ]


def summary(db: Database, ids: list[str], outcomes: list[Any]) -> Any:
    index = {job_id: k for k, job_id in enumerate(ids)}
    states = [db.get(job_id).state for job_id in ids]
    told = [
        type(o.error).__name__
        if hasattr(o, "error")
        else (o.value[0].state, [index[j.id] for j in o.value[1]])
        for o in outcomes
    ]
    return states, told


@settings(max_examples=60, deadline=None)
@given(ENDINGS)
def test_a_group_writes_what_its_endings_one_at_a_time_would(endings: Any) -> None:
    grouped, ids = store()
    alone, ids_alone = store()
    group = members(ids, endings)
    together = _holding.finish_group(grouped, group)
    one_by_one = [
        _holding.finish_group(alone, [member])[0]
        for member in members(ids_alone, endings)
    ]
    assert summary(grouped, ids, together) == summary(alone, ids_alone, one_by_one)
    # Whatever was refused wrote nothing; whatever was not is ended, once.
    for member, result in zip(group, together, strict=True):
        job = grouped.get(member.ending.job_id)
        if hasattr(result, "error"):
            # Not the worker's attempt, or ended already by an earlier one.
            assert isinstance(result.error, (LostJobError, IllegalJobTransitionError))
        else:
            assert job.state in (JobState.COMPLETED, JobState.FAILED)
        targets = [e.target for e in _client.events(grouped, job.id)]
        assert sum(t.terminal for t in targets) == int(job.state.terminal)
    grouped.close()
    alone.close()
