"""examples/jobs_service.py as real processes on a real SQLite file.

Workers are killed with SIGKILL and restarted, drained with SIGTERM, and
run several at once on one file; the audit file (one line per step, per
attempt, per worker) shows that no job ran on two workers at once and that
resumed attempts continue from the saved progress. Waits poll the store
with generous bounds; nothing asserts how fast a step ran.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.examples import EXAMPLES, load_example
from trio_graceful.jobs import (
    JobEvent,
    JobRecord,
    JobState,
    _client,
    _holding,
    _leases,
    open_store,
)
from trio_graceful.jobs._records import JobEnding
from trio_graceful.jobs._sql import Database

pytestmark = pytest.mark.realtime

EXAMPLE = EXAMPLES / "jobs_service.py"
PATIENCE = 60.0  # seconds any wait may take on a loaded machine
S = JobState


class Service:
    """A store file, an audit file, and the worker processes using them."""

    def __init__(self, tmp_path: Path, url: str | None = None) -> None:
        self.db = tmp_path / "jobs.db"
        self.url = url or f"sqlite:///{self.db}"
        self.audit = tmp_path / "audit.jsonl"
        self.tmp_path = tmp_path
        self.workers: list[subprocess.Popen[bytes]] = []
        self.worker_ids: dict[subprocess.Popen[bytes], str] = {}

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(EXAMPLE), "--store", self.url, *args],
            capture_output=True,
            text=True,
            timeout=PATIENCE,
            check=False,
        )

    def submit(self, *args: str) -> str:
        done = self.cli("submit", *args)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def start_worker(self, worker_id: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.tmp_path / f"{worker_id}.log").open("wb")
        process = subprocess.Popen(
            [
                sys.executable,
                str(EXAMPLE),
                "--store",
                self.url,
                "worker",
                "--worker-id",
                worker_id,
                "--audit",
                str(self.audit),
                *args,
            ],
            stdout=log,
            stderr=log,
        )
        log.close()
        self.workers.append(process)
        self.worker_ids[process] = worker_id
        return process

    def leases(self) -> dict[str, float]:
        q = self.queries()
        try:
            return _leases.leases(q)
        finally:
            q.close()

    def stop(self, process: subprocess.Popen[bytes]) -> int:
        # A worker holds a lease once it runs, and so handles SIGTERM: a
        # worker still importing would die of the signal's default action.
        worker_id = self.worker_ids[process]
        self.wait(f"worker {worker_id} to start", lambda: worker_id in self.leases())
        process.send_signal(signal.SIGTERM)
        return process.wait(timeout=PATIENCE)

    def queries(self) -> Database:
        """The store's queries, to read it (or play a worker) from the test."""
        return open_store(self.url)._db  # pyright: ignore[reportPrivateUsage]

    def job(self, job_id: str) -> JobRecord:
        q = self.queries()
        try:
            return q.get(job_id)
        finally:
            q.close()

    def wait(self, what: str, condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + PATIENCE
        while not condition():
            assert time.monotonic() < deadline, f"still waiting for {what}"
            time.sleep(0.05)

    def wait_state(self, job_id: str, state: JobState) -> JobRecord:
        self.wait(
            f"job {job_id} to be {state.value}", lambda: self.job(job_id).state is state
        )
        return self.job(job_id)

    def step(self, job_id: str) -> int:
        return int((self.job(job_id).progress or {}).get("step", 0))

    def audit_lines(self) -> list[dict[str, Any]]:
        if not self.audit.exists():
            return []
        return [json.loads(line) for line in self.audit.read_text().splitlines()]


def stop_all(s: Service) -> None:
    for process in s.workers:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    s = Service(tmp_path)
    yield s
    stop_all(s)


@pytest.fixture
def any_service(tmp_path: Path, store_url: str) -> Iterator[Service]:
    """A service on SQLite, then on PostgreSQL."""
    s = Service(tmp_path, store_url)
    yield s
    stop_all(s)


def attempts_of(
    lines: list[dict[str, Any]], job_id: str, *, stopped: int | None = None
) -> dict[int, list[dict[str, Any]]]:
    """The audit lines of one job, by attempt, checking that attempts never overlap.

    ``stopped``: an attempt whose process was stopped (SIGSTOP) past its
    lease. Nothing can tell a stopped process that its job was taken: once
    it goes on, it may finish the step it was in before it hears, so that
    one line of it may come after the next attempt's first.
    """
    by_attempt: dict[int, list[dict[str, Any]]] = {}
    for line in lines:
        if line["job"] == job_id:
            by_attempt.setdefault(line["attempt"], []).append(line)
    previous: list[dict[str, Any]] = []
    for attempt in sorted(by_attempt):
        rows = by_attempt[attempt]
        assert len({row["worker"] for row in rows}) == 1, rows
        late = [row for row in previous if row["t"] >= rows[0]["t"]]
        allowed = 1 if previous and previous[0]["attempt"] == stopped else 0
        assert len(late) <= allowed, f"attempt {attempt} overlaps the one before"
        previous = rows
    return by_attempt


def test_sigkill_and_restart_loses_nothing(any_service: Service) -> None:
    service = any_service
    first = service.start_worker("A", "--lease", "1", "--cancel-grace", "600")
    hard = service.submit("stubborn", "--steps", "100000", "--step-ms", "50")
    service.wait_state(hard, S.RUNNING)
    service.cli("cancel", hard)
    service.wait_state(hard, S.CANCELLING)
    # Killed after two of its 40 steps, with about 4 s of margin.
    steps = service.submit("steps", "--steps", "40", "--step-ms", "100")
    service.wait("two saved steps", lambda: service.step(steps) >= 2)
    first.kill()
    first.wait()
    saved = service.step(steps)
    assert service.job(steps).state is S.RUNNING
    # A worker that died between timing_out and timed_out, as the store saw it.
    ghost = service.submit("steps")
    q = service.queries()
    try:
        _holding.claim(q, "ghost", now=time.time(), lease=0.5, stale_after=None)
        ending = JobEnding(
            job_id=ghost,
            event=JobEvent.TIME_OUT,
            worker="ghost",
            attempt=1,
            reason="deadline",
        )
        _holding.finish(q, ending, now=time.time())
    finally:
        q.close()

    second = service.start_worker("B", "--lease", "1")
    assert service.wait_state(steps, S.COMPLETED).attempts == 2
    assert service.wait_state(hard, S.CANCELLED).worker == "A"
    assert service.wait_state(ghost, S.TIMED_OUT).worker == "ghost"
    assert service.stop(second) == 0

    runs = attempts_of(service.audit_lines(), steps)
    assert sorted(runs) == [1, 2]
    assert {row["worker"] for row in runs[1]} == {"A"}
    assert {row["worker"] for row in runs[2]} == {"B"}
    # Resumed after the last saved step; every step ran.
    assert runs[2][0]["step"] == saved + 1
    done = {row["step"] for rows in runs.values() for row in rows}
    assert done == set(range(1, 41))
    attempts_of(service.audit_lines(), hard)


def test_several_workers_share_one_store(any_service: Service) -> None:
    service = any_service
    q = service.queries()
    try:
        ids = [
            _client.submit(
                q,
                "steps",
                {"steps": 3, "step_ms": 10},
                timeout=None,
                max_attempts=3,
                now=time.time(),
            )
            for _ in range(16)
        ]
    finally:
        q.close()
    workers = [service.start_worker(f"W{i}", "--concurrency", "2") for i in range(3)]
    for job_id in ids:
        assert service.wait_state(job_id, S.COMPLETED).attempts == 1
    assert [service.stop(w) for w in workers] == [0, 0, 0]
    lines = service.audit_lines()
    for job_id in ids:
        runs = attempts_of(lines, job_id)
        assert [row["step"] for row in runs[1]] == [1, 2, 3]


def test_sigterm_hands_running_jobs_back(service: Service) -> None:
    # The jobs get half of a short grace; the rest hands them back.
    first = service.start_worker("A", "--grace", "1")
    job_id = service.submit("stubborn", "--steps", "100000", "--step-ms", "20")
    service.wait("two saved steps", lambda: service.step(job_id) >= 2)
    assert service.stop(first) == 0
    job = service.job(job_id)
    assert (job.state, job.attempts, job.handbacks) == (S.QUEUED, 1, 1)
    saved = service.step(job_id)
    second = service.start_worker("B")
    service.wait("the job to run again", lambda: service.job(job_id).attempts == 2)
    done = service.cli("cancel", job_id)
    assert (done.returncode, done.stdout) == (
        0,
        f"cancellation of {job_id} requested; it is running\n",
    )
    service.wait_state(job_id, S.CANCELLED)
    assert service.stop(second) == 0
    runs = attempts_of(service.audit_lines(), job_id)
    assert runs[2][0]["step"] == saved + 1


def test_status_timeouts_and_staleness(service: Service) -> None:
    worker = service.start_worker("A", "--stale-after", "0.5")
    hung = service.submit("steps", "--steps", "5", "--step-ms", "1", "--hang-at", "2")
    timed = service.submit(
        "blocking",
        "--steps",
        "5",
        "--step-ms",
        "1",
        "--hang-at",
        "3",
        "--timeout",
        "1.5",
    )
    failing = service.submit(
        "steps", "--steps", "5", "--step-ms", "1", "--fail-at", "2"
    )
    service.wait_state(failing, S.FAILED)
    job = service.wait_state(timed, S.TIMED_OUT)
    assert job.elapsed is not None
    assert job.elapsed >= 1.5
    assert job.timed_out_at is not None
    assert job.ended_at is not None
    assert job.timed_out_at <= job.ended_at

    def stale() -> bool:
        done = service.cli("status", hung, "--json")
        return json.loads(done.stdout)["stale"] is True

    service.wait("the hung job to be reported stale", stale)
    assert service.job(hung).state is S.RUNNING
    done = service.cli("status", "--json")
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [row["id"] for row in rows] == [hung, timed, failing]
    required = {
        "id",
        "kind",
        "state",
        "attempts",
        "worker",
        "created_at",
        "started_at",
        "ended_at",
        "last_heartbeat_at",
        "progress",
        "stale",
        "timed_out_at",
        "error",
        "queued_at",
        "waited",
        "traceback",
    }
    assert all(required <= row.keys() for row in rows)
    assert rows[2]["error"] == "raised RuntimeError('failed at step 2')"
    assert rows[1]["state"] == "timed_out"
    assert service.stop(worker) == 0
    # The hung job was cooperative: handed back at the shutdown.
    assert service.job(hung).state is S.QUEUED


def test_status_shows_waits_and_tracebacks(service: Service) -> None:
    q = service.queries()
    try:
        # A kind this worker has no function for: it is left queued.
        report = _client.submit(
            q, "report", {}, timeout=None, max_attempts=3, now=time.time()
        )
    finally:
        q.close()
    worker = service.start_worker("A")
    failing = service.submit(
        "steps", "--steps", "5", "--step-ms", "1", "--fail-at", "2"
    )
    service.wait_state(failing, S.FAILED)
    done = service.cli("status", "--json")
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(row["id"], row["state"], row["attempts"]) for row in rows] == [
        (report, "queued", 0),
        (failing, "failed", 1),
    ]
    assert rows[0]["waited"] > 0
    assert rows[0]["traceback"] is None
    assert rows[1]["waited"] is None
    traceback = rows[1]["traceback"]
    assert traceback.startswith("Traceback (most recent call last):\n")
    assert ", in steps\n" in traceback
    assert traceback.endswith("\nRuntimeError: failed at step 2\n")
    failed_line = (
        f"{failing} steps failed step=1 error=raised RuntimeError('failed at step 2')"
    )
    lines = service.cli("status").stdout.splitlines()
    # No progress shows as none.
    assert re.fullmatch(rf"{report} report queued step=none waited=\d+\.\ds", lines[0])
    assert lines[1:] == [failed_line]
    done = service.cli("status", failing, "--traceback")
    assert done.stdout == failed_line + "\n" + textwrap.indent(traceback, "    ")
    assert service.stop(worker) == 0
    assert service.job(report).state is S.QUEUED
    log = (service.tmp_path / "A.log").read_text()
    warning = (
        f"WARNING trio_graceful.jobs: worker A: job {failing} (steps) failed: "
        "raised RuntimeError('failed at step 2')\nTraceback (most recent call last):"
    )
    assert warning in log


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["submit", "nope"], "unknown job kind 'nope'"),
        (
            ["submit", "steps", "--timeout", "-1"],
            "must be a finite number > 0, not '-1'",
        ),
        (
            ["submit", "steps", "--timeout", "nan"],
            "must be a finite number > 0, not 'nan'",
        ),
        (["worker", "--grace", "-2"], "argument --grace: grace must be >= 0, not -2.0"),
        (
            ["worker", "--health-port", "http"],
            "health_port must be a port number in 0..65535, not 'http'",
        ),
    ],
)
def test_bad_arguments_write_nothing(
    service: Service, args: list[str], message: str
) -> None:
    done = service.cli(*args)
    assert done.returncode == 2
    assert message in done.stderr
    assert not service.db.exists()


def test_malformed_url_and_non_database(service: Service, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--store", "postgres:/x", "status"],
        capture_output=True,
        text=True,
        timeout=PATIENCE,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert (
        "store URL must look like sqlite:///path/to/file.db or "
        "postgresql://host/database, not 'postgres:/x'" in done.stderr
    )
    assert os.listdir(tmp_path) == []
    service.db.write_bytes(b"not a database" * 100)
    done = service.cli("status")
    assert done.returncode == 1
    assert f"store file '{service.db}' is not a usable SQLite database" in done.stderr
    assert service.db.read_bytes() == b"not a database" * 100


def test_unknown_job_id(service: Service) -> None:
    service.submit("steps")
    for command in (["cancel", "nope"], ["status", "nope", "--json"]):
        done = service.cli(*command)
        assert (done.returncode, done.stdout) == (1, "")
        assert "no job with id 'nope'" in done.stderr
    q = service.queries()
    try:
        assert len(_client.events(q, None)) == 1
    finally:
        q.close()


@pytest.mark.parametrize("command", [["worker"], ["status"], ["submit", "steps"]])
def test_a_store_that_cannot_be_opened_is_one_line_on_stderr(
    tmp_path: Path, command: list[str]
) -> None:
    missing = tmp_path / "missing" / "jobs.db"
    service = Service(tmp_path, f"sqlite:///{missing}")
    done = service.cli(*command)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"jobs_service: error: store file '{missing}' cannot be opened: "
        "unable to open database file\n"
    )
    # With --debug, the traceback follows, at DEBUG.
    done = service.cli("--debug", *command)
    assert done.returncode == 1
    first, *rest = done.stderr.splitlines()
    assert first.startswith("jobs_service: error: store file ")
    assert rest[:2] == [
        "DEBUG jobs_service: the error's traceback",
        "Traceback (most recent call last):",
    ]
    assert not missing.parent.exists()


def test_an_unreachable_postgres_server_is_one_line_on_stderr(tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    # No server listens on a socket in an empty directory.
    url = f"postgresql://postgres@/postgres?host={tmp_path}"
    for command in (["worker"], ["status"]):
        done = Service(tmp_path, url).cli(*command)
        assert (done.returncode, done.stdout) == (1, "")
        [line] = done.stderr.splitlines()
        assert line.startswith(
            f"jobs_service: error: cannot connect to the PostgreSQL store '{url}': "
        )


def test_a_bad_worker_option_is_one_line_on_stderr(service: Service) -> None:
    done = service.cli("worker", "--worker-id", "")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == "jobs_service: error: worker_id must not be empty\n"


def options_help(text: str) -> dict[str, str]:
    """The help of each option in an argparse help text, by its first name."""
    blocks = re.split(r"\n  (?=-)", text.split("\n\n", 2)[-1])
    return {
        block.split()[0].rstrip(","): " ".join(block.split())
        for block in blocks
        if block.startswith("-")
    }


@pytest.mark.parametrize("command", [[], ["worker"], ["submit"], ["status"]])
def test_every_option_says_what_it_does_and_its_default(
    service: Service, command: list[str]
) -> None:
    done = service.cli(*command, "--help")
    assert done.returncode == 0, done.stderr
    helps = options_help(done.stdout)
    assert helps.keys() > {"-h"}
    for name, text in helps.items():
        if name != "-h":
            assert "(default: " in text, (name, text)


def test_submit_help_lists_the_kinds_of_the_registry(service: Service) -> None:
    kinds = list(load_example("jobs_service").job_functions(None))
    assert kinds == ["steps", "stubborn", "blocking"]
    done = service.cli("submit", "--help")
    assert f"The kinds: {', '.join(kinds)}." in " ".join(done.stdout.split())
    assert f"kind one of {', '.join(kinds)}" in " ".join(done.stdout.split())


def test_the_worker_says_who_it_is_and_uses_the_grace_its_help_shows(
    service: Service,
) -> None:
    helps = options_help(service.cli("worker", "--help").stdout)
    assert helps["--grace"].endswith("(default: 15)")
    assert helps["--lease"].endswith("(default: 30)")
    worker = service.start_worker("A")
    service.wait("worker A to start", lambda: "A" in service.leases())
    log = service.tmp_path / "A.log"
    service.wait("the start line", lambda: "serving" in log.read_text())
    assert service.stop(worker) == 0
    lines = log.read_text().splitlines()
    assert lines[0] == (
        f"INFO jobs_service: worker A serving {service.url}: kinds steps, "
        "stubborn, blocking; concurrency 4; lease 30 s (after a crash, a "
        "restart with --worker-id A takes its jobs over at once; under "
        "another id they wait for the lease to run out); grace 15 s (10 s "
        "for the jobs to finish, the rest to hand them back); cancel grace 5 s"
    )
    assert "WARNING trio_graceful.runner: SIGTERM: shutting down (grace 15 s)" in lines


def test_status_shows_who_holds_a_job_and_when_its_lease_ends(
    service: Service,
) -> None:
    worker = service.start_worker("A", "--lease", "40")
    job_id = service.submit("steps", "--steps", "5", "--step-ms", "1", "--hang-at", "2")
    service.wait("a saved step", lambda: service.step(job_id) >= 1)
    line = service.cli("status", job_id).stdout
    match = re.fullmatch(
        rf"{job_id} steps running step=1 worker=A lease ends in (\d+) s\n", line
    )
    assert match is not None, line
    assert 0 < int(match[1]) <= 40
    row = json.loads(service.cli("status", job_id, "--json").stdout)
    assert row["worker"] == "A"
    assert 0 < row["lease_ends_in"] <= 40
    assert row["lease_expires_at"] == pytest.approx(
        time.time() + row["lease_ends_in"], abs=5
    )
    assert service.stop(worker) == 0
    # Handed back: queued, held by no one.
    row = json.loads(service.cli("status", job_id, "--json").stdout)
    assert (row["state"], row["lease_ends_in"]) == ("queued", None)


def test_a_job_that_ignores_a_cancel_and_finishes_is_completed(
    service: Service,
) -> None:
    worker = service.start_worker("A", "--cancel-grace", "600")
    job_id = service.submit("stubborn", "--steps", "12", "--step-ms", "300")
    service.wait("a saved step", lambda: service.step(job_id) >= 1)
    done = service.cli("cancel", job_id)
    assert done.returncode == 0, done.stderr
    at_cancel = service.wait_state(job_id, S.CANCELLING).progress

    def moved_on() -> bool:
        job = service.job(job_id)
        return job.state is S.CANCELLING and job.progress != at_cancel

    # Its progress shows while the cancel request is served.
    service.wait("progress while cancelling", moved_on)
    job = service.wait_state(job_id, S.COMPLETED)
    assert (job.result, job.error, job.progress) == ({"steps": 12}, None, {"step": 12})
    assert service.stop(worker) == 0
