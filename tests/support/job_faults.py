"""Helpers of the fault tests: a PostgreSQL server of a test's own, and checks.

The session's server (tests/support/postgres.py) is shared by every test;
a test that restarts or stops its server needs one of its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import attrs

from tests.examples.test_jobs_service import Service, attempts_of
from tests.support.postgres import as_server_user, bin_dir
from trio_graceful.jobs import JobState, _client, open_store

S = JobState


@attrs.frozen
class PostgresServer:
    """A server in ``home``, controlled with pg_ctl as the ``postgres`` user."""

    bin_dir: str
    home: str

    @property
    def url(self) -> str:
        return f"postgresql://postgres@/postgres?host={self.home}"

    def ctl(self, *args: str) -> None:
        subprocess.run(
            as_server_user(
                [
                    f"{self.bin_dir}/pg_ctl",
                    "-D",
                    os.path.join(self.home, "data"),
                    "-w",
                    "-l",
                    os.path.join(self.home, "log"),
                    "-o",
                    f"-k {self.home} -c listen_addresses='' -c fsync=off",
                    *args,
                ]
            ),
            check=True,
            capture_output=True,
            timeout=60,
        )


@contextmanager
def own_postgres() -> Iterator[PostgresServer]:
    """A fresh server, stopped and removed at the end."""
    where = bin_dir()
    assert where is not None
    home = tempfile.mkdtemp(prefix="trio-graceful-pg-own-")
    if os.geteuid() == 0:
        shutil.chown(home, "postgres")
    subprocess.run(
        as_server_user(
            [
                f"{where}/initdb",
                "-D",
                os.path.join(home, "data"),
                "-A",
                "trust",
                "-U",
                "postgres",
            ]
        ),
        check=True,
        capture_output=True,
    )
    server = PostgresServer(where, home)
    server.ctl("start")
    try:
        yield server
    finally:
        subprocess.run(
            as_server_user(
                [
                    f"{where}/pg_ctl",
                    "-D",
                    os.path.join(home, "data"),
                    "-m",
                    "immediate",
                    "stop",
                ]
            ),
            check=False,
            capture_output=True,
        )
        shutil.rmtree(home, ignore_errors=True)


def submit_many(
    url: str, n: int, steps: int, step_ms: int, attempts: int = 3
) -> list[str]:
    q = open_store(url)._db  # pyright: ignore[reportPrivateUsage]
    try:
        return [
            _client.submit(
                q,
                "steps",
                {"steps": steps, "step_ms": step_ms},
                timeout=None,
                max_attempts=attempts,
                now=time.time(),
            )
            for _ in range(n)
        ]
    finally:
        q.close()


def assert_each_completed_once(
    service: Service,
    ids: list[str],
    steps: int,
    *,
    stopped: Mapping[str, int] | None = None,
) -> None:
    """Completed, once, with every step run; no job failed because of the store.

    ``stopped``: the attempt of each job whose worker was stopped (SIGSTOP)
    past its lease (see `attempts_of`).
    """
    q = service.queries()
    try:
        for job_id in ids:
            job = q.get(job_id)
            assert (job.state, job.error, job.result) == (
                S.COMPLETED,
                None,
                {"steps": steps},
            ), job
            targets = [e.target for e in _client.events(q, job_id)]
            assert targets.count(S.COMPLETED) == 1, targets
            assert S.FAILED not in targets, targets
    finally:
        q.close()
    lines = service.audit_lines()
    for job_id in ids:
        runs = attempts_of(lines, job_id, stopped=(stopped or {}).get(job_id))
        done = {row["step"] for rows in runs.values() for row in rows}
        assert done == set(range(1, steps + 1))


def wait_all_ended(service: Service, ids: list[str]) -> None:
    """Wait until every job of ``ids`` is in a terminal state."""

    def ended() -> bool:
        q = service.queries()
        try:
            return all(job.state.terminal for job in _client.jobs(q, ids))
        finally:
            q.close()

    service.wait("every job to end", ended)


def log_of(service: Service, worker_id: str) -> str:
    return (service.tmp_path / f"{worker_id}.log").read_text()
