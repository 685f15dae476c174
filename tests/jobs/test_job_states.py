"""The job transition table, walked h11-style, and random histories against it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from trio_graceful.jobs import (
    TRANSITIONS,
    IllegalJobTransitionError,
    JobEvent,
    JobState,
    LostJobError,
    _client,
    _holding,
)
from trio_graceful.jobs._records import JobEnding
from trio_graceful.jobs._sql import Database
from trio_graceful.jobs._sqlite import SQLiteConnection
from trio_graceful.jobs._states import JOB_TABLE, diagram_lines

S = JobState
E = JobEvent

EXPECTED = {
    (S.QUEUED, E.CLAIM): S.RUNNING,
    (S.QUEUED, E.CANCEL): S.CANCELLED,
    (S.RUNNING, E.COMPLETE): S.COMPLETED,
    (S.RUNNING, E.FAIL): S.FAILED,
    (S.RUNNING, E.CANCEL): S.CANCELLING,
    (S.RUNNING, E.TIME_OUT): S.TIMING_OUT,
    (S.RUNNING, E.REQUEUE): S.QUEUED,
    (S.CANCELLING, E.FINISH_CANCEL): S.CANCELLED,
    (S.CANCELLING, E.COMPLETE): S.COMPLETED,
    (S.TIMING_OUT, E.FINISH_TIME_OUT): S.TIMED_OUT,
}


def test_the_table_is_exactly_the_documented_one() -> None:
    assert dict(TRANSITIONS) == EXPECTED


def test_terminal_states() -> None:
    assert {s for s in S if s.terminal} == {
        S.COMPLETED,
        S.FAILED,
        S.CANCELLED,
        S.TIMED_OUT,
    }


@pytest.mark.parametrize(("source", "event"), sorted(EXPECTED, key=str))
def test_every_legal_transition(source: JobState, event: JobEvent) -> None:
    assert JOB_TABLE.move(source, event, subject="job j") is EXPECTED[source, event]


ILLEGAL = [(s, e) for s in S for e in E if (s, e) not in EXPECTED]


@pytest.mark.parametrize(("source", "event"), ILLEGAL)
def test_every_illegal_transition_raises(source: JobState, event: JobEvent) -> None:
    legal = " or ".join(s.value for s in S if (s, event) in EXPECTED)
    with pytest.raises(IllegalJobTransitionError) as info:
        JOB_TABLE.move(source, event, subject="job j1")
    assert str(info.value) == (
        f"job j1 cannot {event.value} while {source.value}; "
        f"that is legal only while {legal}"
    )


def test_the_documented_diagram_is_the_table() -> None:
    lines = diagram_lines()
    assert len(lines) == len(EXPECTED)
    assert lines[0] == "queued      --claim------------>  running"
    assert "cancelling  --finish cancel---->  cancelled [end]" in lines
    page = (Path(__file__).parents[2] / "docs" / "jobs.rst").read_text()
    assert "\n".join(f"   {line}" for line in lines) in page


def _apply(q: Database, job_id: str, event: JobEvent, now: float) -> None:
    """Drive one event through the store, as the worker or a client would."""
    job = q.get(job_id)
    if event is E.CLAIM:
        if job.state is S.QUEUED:
            assert (
                _holding.claim(q, "w", now=now, lease=10, stale_after=None) is not None
            )
        else:
            # Nothing queued: a claim finds nothing and changes nothing.
            assert _holding.claim(q, "w", now=now, lease=10, stale_after=None) is None
        return
    if event is E.CANCEL and job.state is S.QUEUED:
        _client.request_cancel(q, job_id, now=now)
        return
    # Attempts count from 1: a job never claimed refuses the first as not "w"'s.
    attempt = max(job.attempts, 1)
    ending = JobEnding(
        job_id=job_id, event=event, worker="w", attempt=attempt, reason="test"
    )
    _holding.finish(q, ending, now=now)


@given(st.lists(st.sampled_from(list(E)), max_size=12))
def test_random_histories_follow_the_table(events: list[JobEvent]) -> None:
    q = Database(SQLiteConnection(":memory:"))
    try:
        job_id = _client.submit(q, "k", {}, timeout=None, max_attempts=3, now=0.0)
        model = S.QUEUED
        for now, event in enumerate(events, start=1):
            before = q.get(job_id)
            log_before = _client.events(q, job_id)
            target = TRANSITIONS.get((model, event))
            if target is None and event is not E.CLAIM:
                # Refused: by the table if "w" holds the job (it wrote the
                # last transition), and as not its own if it never did.
                ours = log_before[-1].worker == "w"
                refusal = IllegalJobTransitionError if ours else LostJobError
                with pytest.raises(refusal):
                    _apply(q, job_id, event, float(now))
                assert q.get(job_id) == before
                assert _client.events(q, job_id) == log_before
                continue
            _apply(q, job_id, event, float(now))
            if target is None:
                assert q.get(job_id) == before
                continue
            model = target
            after = q.get(job_id)
            assert after.state is model
            assert (after.ended_at is not None) == model.terminal
            last = _client.events(q, job_id)[-1]
            assert (last.source, last.target, last.at) == (before.state, model, now)
        # The audit log replays to the final state through legal steps only.
        log = _client.events(q, job_id)
        assert log[0].source is None
        assert log[0].target is S.QUEUED
        for row in log[1:]:
            assert row.source is not None
            assert row.target in {
                t for (s, _), t in TRANSITIONS.items() if s is row.source
            }
        assert log[-1].target is model
    finally:
        q.close()
