"""A group of endings writes what the same endings, one at a time, would write.

For endings of every kind a worker writes (completed with a result, failed
with an error and a traceback, timed out, handed back), of jobs held by two
workers, some refused (an attempt the worker does not hold, a job ended
already, a worker id another process took over), some of one job twice,
each with a claim of its own: one group transaction and one transaction per
ending, in the same order, leave the same rows, the same audit rows and
tracebacks, the same records and claims for each ending, and the same
refusals.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
from hypothesis import given, settings, strategies as st

from trio_graceful.jobs import (
    IllegalJobTransitionError,
    JobEvent,
    JobRecord,
    LostJobError,
    WorkerReplacedError,
    _client,
    _holding,
)
from trio_graceful.jobs._holding import ClaimRequest, GroupedEnding
from trio_graceful.jobs._records import JobEnding
from trio_graceful.jobs._sql import Database
from trio_graceful.jobs._sqlite import SQLiteConnection

RUNNING, QUEUED = 6, 6
# Jobs 0-2 run under worker "w", 3-5 under "v", both of incarnation "i":
# an ending of incarnation "j" comes from a process that lost the id, and is
# refused.
WORKERS = ("w", "v")
HOLDER = {k: WORKERS[k * len(WORKERS) // RUNNING] for k in range(RUNNING)}
EVENTS = [
    JobEvent.COMPLETE,
    JobEvent.FAIL,
    JobEvent.CANCEL,
    JobEvent.FINISH_CANCEL,
    JobEvent.TIME_OUT,
    JobEvent.FINISH_TIME_OUT,
    JobEvent.REQUEUE,
]
# Per ending: which running job, which transition (cancelling and timing
# out, then their ends, make two endings of one job), whether by the job's
# worker (else the other), held or not (a later attempt), which
# incarnation, claim limit (of "w" only: see `members`).
ENDINGS = st.lists(
    st.tuples(
        st.integers(0, RUNNING - 1),
        st.sampled_from(EVENTS),
        st.booleans(),
        st.booleans(),
        st.sampled_from(["i", "i", "i", "j"]),
        st.integers(0, 3),
    ),
    max_size=10,
)


def store() -> tuple[Database, list[str]]:
    """Jobs 0..RUNNING-1 running under their `HOLDER`, the rest queued, in order."""
    db = Database(SQLiteConnection(":memory:"))
    ids = [
        _client.submit(db, "k", {}, timeout=None, max_attempts=3, now=float(k))
        for k in range(RUNNING + QUEUED)
    ]
    claimed: list[JobRecord] = []
    for worker in WORKERS:
        claimed += _holding.claim_many(
            db,
            worker,
            now=100.0,
            lease=30,
            stale_after=None,
            incarnation="i",
            limit=RUNNING // len(WORKERS),
        )
    assert [job.id for job in claimed] == ids[:RUNNING]
    return db, ids


def changes(event: JobEvent, k: int) -> tuple[dict[str, Any], str | None]:
    """What an ending of ``event`` of job ``k`` sets, and its traceback."""
    if event is JobEvent.COMPLETE:
        return {"result": json.dumps({"k": k}), "elapsed": 0.5 + k}, None
    if event is JobEvent.FAIL:
        return {"error": f"boom {k}", "elapsed": 0.25}, f"Traceback {k}"
    return {}, None


def members(ids: list[str], endings: Any) -> list[GroupedEnding]:
    # A worker hands jobs back only as it drains, when it claims none: a
    # group's claims come after all its endings, a hand-back's job among
    # the queued.
    draining = any(event is JobEvent.REQUEUE for _, event, *_ in endings)
    group: list[GroupedEnding] = []
    for k, event, own, held, incarnation, limit in endings:
        worker = HOLDER[k] if own else next(w for w in WORKERS if w != HOLDER[k])
        sets, traceback = changes(event, k)
        ending = JobEnding(
            job_id=ids[k],
            event=event,
            worker=worker,
            attempt=1 if held else 2,
            reason=f"r{k}",
            changes=sets,
            traceback=traceback,
        )
        # Only "w" claims jobs: a group claims each worker's jobs in one
        # query, after all its endings, so with two workers claiming, which
        # gets which queued job may differ from one at a time (each gets as
        # many). "v" renews its lease all the same.
        claim = ClaimRequest(
            limit=0 if draining or worker != "w" else limit,
            lease=30,
            stale_after=None,
            incarnation=incarnation,
            kinds=None,
        )
        group.append(GroupedEnding(ending, 200.0, claim))
    return group


def summary(db: Database, ids: list[str], outcomes: list[Any]) -> Any:
    index = {job_id: k for k, job_id in enumerate(ids)}

    def plain(job: JobRecord) -> JobRecord:
        return attrs.evolve(job, id=str(index[job.id]))

    rows = [plain(db.get(job_id)) for job_id in ids]
    # Each job's audit rows, in order: a group writes its claims after all
    # its endings, so rows of different jobs may come in another order.
    audit: dict[int, list[Any]] = {}
    for e in _client.events(db, None):
        audit.setdefault(index[e.job], []).append(
            (e.source, e.target, e.at, e.worker, e.reason)
        )
    tracebacks = db.execute("SELECT job, traceback FROM job_tracebacks")
    told = [
        type(o.error).__name__
        if hasattr(o, "error")
        else (plain(o.value[0]), [plain(j) for j in o.value[1]])
        for o in outcomes
    ]
    return rows, audit, sorted((index[j], t) for j, t in tracebacks), told


@settings(max_examples=100, deadline=None)
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
    # Whatever was refused wrote nothing; no job is ended twice.
    for member, result in zip(group, together, strict=True):
        job = grouped.get(member.ending.job_id)
        if hasattr(result, "error"):
            # Not the worker's attempt, ended already by an earlier one, or
            # the worker's id taken over.
            refusals = (LostJobError, IllegalJobTransitionError, WorkerReplacedError)
            assert isinstance(result.error, refusals)
        targets = [e.target for e in _client.events(grouped, job.id)]
        assert sum(t.terminal for t in targets) == int(job.state.terminal)
    grouped.close()
    alone.close()
