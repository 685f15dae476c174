"""What the job store sends to its database: round trips, plans, errors.

On PostgreSQL a transaction's statements travel in one pipeline, and the
answers are read only where they are needed: the round trips of a group of
endings do not grow with it, and an error of a statement whose answer was
never read still rolls the whole transaction back. Claims read the index of
queued jobs, and keep one plan.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pytest
import trio
import trio.testing

from trio_graceful.jobs import JobEvent, JobRecord, JobState, _client, open_store
from trio_graceful.jobs._sql import Database
from trio_graceful.jobs._store import JobStore

S = JobState
OPTIONS: dict[str, Any] = {
    "worker": "w",
    "lease": 30.0,
    "stale_after": None,
    "incarnation": "i",
    "reason": "done",
}


async def submit_many(store: JobStore, n: int) -> list[str]:
    """Queue ``n`` jobs of kind "noop", a second apart; return their ids."""
    db = store._db  # pyright: ignore[reportPrivateUsage]

    def submit() -> list[str]:
        return [
            _client.submit(db, "noop", {}, timeout=None, max_attempts=3, now=k)
            for k in range(n)
        ]

    return await trio.to_thread.run_sync(submit)


async def end_together(store: JobStore, jobs: list[JobRecord]) -> None:
    """Complete ``jobs``, each claiming one more, in one group."""
    calls = store._calls  # pyright: ignore[reportPrivateUsage]
    await calls.acquire()  # a call in flight: the endings wait, and group

    async def end(job: JobRecord) -> None:
        await store.finish_then_claim(
            job.id, JobEvent.COMPLETE, attempt=1, limit=1, **OPTIONS
        )

    async with trio.open_nursery() as nursery:
        for job in jobs:
            nursery.start_soon(end, job)
        await trio.testing.wait_all_tasks_blocked()
        calls.release()


def claim_statements(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[str, Sequence[Any]]]:
    """The claims ``store`` sends from now on: (statement, arguments)."""
    sent: list[tuple[str, Sequence[Any]]] = []
    send = Database.send

    def recording(db: Database, sql: str, args: Sequence[Any] = ()) -> Any:
        if sql.startswith("UPDATE jobs") and "RETURNING" in sql:
            sent.append((sql, args))
        return send(db, sql, args)

    monkeypatch.setattr(Database, "send", recording)
    return sent


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each round trip of a pipeline to the server, as it is made."""
    import psycopg

    trips: list[str] = []
    sync, exit_ = psycopg.Pipeline.sync, psycopg.Pipeline.__exit__

    def counted_sync(pipeline: psycopg.Pipeline) -> None:
        trips.append("sync")
        sync(pipeline)

    def counted_exit(pipeline: psycopg.Pipeline, *exc_info: Any) -> None:
        trips.append("end")
        exit_(pipeline, *exc_info)

    monkeypatch.setattr(psycopg.Pipeline, "sync", counted_sync)
    monkeypatch.setattr(psycopg.Pipeline, "__exit__", counted_exit)
    return trips


async def test_a_group_with_its_claims_is_three_round_trips_whatever_its_size(
    postgres_url: str, round_trips: list[str]
) -> None:
    with open_store(postgres_url) as store:
        await submit_many(store, 12)
        for size in (1, 5):
            jobs = await store.claim_many("w", limit=size, lease=30, incarnation="i")
            round_trips.clear()
            await end_together(store, jobs)
            assert store.statistics().largest_group == size
            # The reads; the writes and the claim; the audit rows and COMMIT.
            assert round_trips == ["sync", "sync", "end"]
        round_trips.clear()
        await store.claim_many("w", limit=1, lease=30, incarnation="i")
        assert round_trips == ["sync", "sync", "end"]


async def test_an_error_of_a_statement_sent_unread_rolls_the_transaction_back(
    store_url: str,
) -> None:
    with open_store(store_url) as store:
        # An audit row that the database refuses: sent with the statements
        # after it, its answer is never read, and its error comes all the same.
        db = store._db  # pyright: ignore[reportPrivateUsage]
        if store_url.startswith("sqlite"):
            db.execute(
                "CREATE TRIGGER refuse BEFORE INSERT ON job_events "
                "WHEN NEW.reason = 'refused' BEGIN SELECT RAISE(ABORT, 'no'); END"
            )
        else:
            db.execute(
                "ALTER TABLE job_events ADD CONSTRAINT refuse "
                "CHECK (reason <> 'refused')"
            )
        await submit_many(store, 2)
        [job] = await store.claim_many("w", limit=1, lease=30, incarnation="i")
        with pytest.raises(Exception, match=r"refuse|no") as caught:
            await store.finish_then_claim(
                job.id,
                JobEvent.COMPLETE,
                attempt=1,
                limit=1,
                **OPTIONS | {"reason": "refused"},
            )
        assert not store.is_outage(caught.value)
        # Nothing of it was written, the claim neither.
        assert [j.state for j in await store.jobs()] == [S.RUNNING, S.QUEUED]
        assert [e.target for e in await store.events(job.id)] == [S.QUEUED, S.RUNNING]
        # The connection goes on.
        done, [successor] = await store.finish_then_claim(
            job.id, JobEvent.COMPLETE, attempt=1, limit=1, **OPTIONS
        )
        assert (done.state, successor.state) == (S.COMPLETED, S.RUNNING)


async def test_claims_read_the_queued_jobs_in_index_order_oldest_first(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_store(store_url) as store:
        ids = await submit_many(store, 300)
        db = store._db  # pyright: ignore[reportPrivateUsage]
        db.execute("ANALYZE")
        sent = claim_statements(store, monkeypatch)
        first = await store.claim_many("w", limit=3, lease=30, kinds=["noop"])
        second = await store.claim_many("w", limit=2, lease=30, kinds=["noop"])
        assert [job.id for job in first + second] == ids[:5]
        assert len(sent) == 2
        for sql, args in sent:
            if store_url.startswith("sqlite"):
                rows = db.execute(f"EXPLAIN QUERY PLAN {sql}", args)
                plan = "\n".join(row[-1] for row in rows)
                assert "USING INDEX jobs_by_state (state=?)" in plan
                assert "TEMP B-TREE" not in plan  # no sort of the queue
            else:
                rows = db.execute(f"EXPLAIN {sql}", args)
                plan = "\n".join(row[0] for row in rows)
                assert "Index Scan using jobs_by_state" in plan
                # Ties in time are sorted among themselves, not the queue.
                assert not re.search(r"(^|->) *Sort  \(", plan, re.MULTILINE), plan


async def test_a_claim_keeps_one_plan_on_postgresql(
    postgres_url: str,
) -> None:
    with open_store(postgres_url) as store:
        await submit_many(store, 2000)
        db = store._db  # pyright: ignore[reportPrivateUsage]
        db.execute("ANALYZE")
        # psycopg prepares a statement at its fifth run; PostgreSQL plans
        # it for its first five runs after that, then keeps a generic plan
        # only if that is as good as the plans made for each run.
        for _ in range(15):
            await store.claim_many("w", limit=1, lease=30)
        [(generic, custom)] = db.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE ?",
            ("UPDATE jobs SET state%RETURNING%",),
        )
        assert (generic, custom) == (5, 5)


async def test_without_pipelines_the_same_transactions_run_statement_by_statement(
    postgres_url: str, round_trips: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    # What a libpq before 14 says: no pipeline mode.
    monkeypatch.setattr(psycopg.Pipeline, "is_supported", classmethod(lambda _: False))
    with open_store(postgres_url) as store:
        await submit_many(store, 6)
        jobs = await store.claim_many("w", limit=3, lease=30, incarnation="i")
        await end_together(store, jobs)
        assert store.statistics().largest_group == 3
        states = sorted(job.state.value for job in await store.jobs())
        assert states == ["completed"] * 3 + ["running"] * 3
        assert round_trips == []  # no pipeline was opened
