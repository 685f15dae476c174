"""The jobs bench against procrastinate and pgqueuer keeps working.

``bench/bench_jobs.py --peers --quick``, cut down to what runs here in
seconds: trio_graceful alone (the peers are left out as if not installed,
which is also what happens where they are not), on SQLite and on the test
session's PostgreSQL. Nothing here checks a timing; what is checked is that
every case runs every job, that the counters of the server and the CPU
times are read, and that the results file and its table are written.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import docutils.core
import pytest

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import _jobs_peers  # noqa: E402
import _jobs_versus  # noqa: E402

pytestmark = pytest.mark.realtime

TITLES = [
    "no-op, 1 process x 1",
    "no-op, 1 process x 10",
    "no-op, 4 processes x 1",
    "no-op, 4 processes x 10",
]


@pytest.fixture
def without_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_jobs_peers, "procrastinate", None)
    monkeypatch.setattr(_jobs_peers, "pgqueuer", None)


@pytest.mark.usefixtures("without_peers")
def test_a_peer_not_installed_is_left_out_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "jobs_peers.json"
    results = _jobs_versus.run(
        quick=True, postgres=None, output=output, stores=["sqlite"]
    )
    reasons = {
        library: f"{library} is not installed "
        "(pip install -r bench/requirements-peers.txt)"
        for library in ("procrastinate", "pgqueuer")
    }
    assert results["skipped"] == reasons
    assert capsys.readouterr().err.count("skipped: ") == 2
    assert [c["title"] for c in results["cases"]] == [f"SQLite, {t}" for t in TITLES]
    for case in results["cases"]:
        [measured] = case["rounds"]["trio_graceful"]
        assert measured["rate"] > 0
    assert json.loads(output.read_text()) == results
    table = output.with_suffix(".rst").read_text()
    text = docutils.core.publish_doctree(table).astext()
    assert "trio_graceful on SQLite" in text
    assert text.count("SQLite, no-op") == 4


@pytest.mark.usefixtures("without_peers")
def test_on_postgresql_the_commits_and_flushes_are_counted(
    postgres_server: str,
) -> None:
    results = _jobs_versus.run(
        quick=True, postgres=postgres_server, output=None, stores=["postgresql"]
    )
    assert [c["title"] for c in results["cases"]] == [
        f"PostgreSQL, {t}" for t in TITLES
    ]
    for case in results["cases"]:
        assert list(case["rounds"]) == ["trio_graceful"]
        [measured] = case["rounds"]["trio_graceful"]
        assert measured["rate"] > 0
        # Each job's ending is committed, and nothing else runs on the
        # database: the watcher's own commits are taken off.
        assert 1 / 10 <= measured["commits per job"] < 10
        # The test server runs with fsync off: no flush to count.
        assert measured["WAL flushes per job"] >= 0
        assert measured["WAL writes per job"] > 0
        # Read in clock ticks: a quick round's few jobs may take less than one.
        assert measured["worker CPU per job"] >= 0
        assert measured["server CPU per job"] >= 0
    latencies = results["latencies"]
    assert set(latencies) == {"round trip", "durable commit"}
    assert 0 < latencies["round trip"] < 10
    assert 0 < latencies["durable commit"] < 10
    [jobs, counts, cpu] = list(_jobs_versus.tables(results))
    assert jobs.columns == ["jobs/s", "trio_graceful"]
    assert any(note.startswith("The server, before the rounds") for note in jobs.notes)
    assert cpu.columns == ["CPU per job, worker + server", "trio_graceful"]
    assert cpu.rows[0][1].endswith(" µs")
    assert counts.columns == ["WAL flushes / commits per job", "trio_graceful"]
    assert counts.rows[0][0] == "PostgreSQL, no-op, 1 process x 1"
    assert " / " in counts.rows[0][1]
    assert [row[0] for row in cpu.rows] == [row[0] for row in counts.rows]


def test_cpu_time_counts_what_a_process_spends_from_the_start() -> None:
    clock = _jobs_versus.CpuClock([os.getpid()])
    started = time.process_time()
    while time.process_time() - started < 0.2:
        pass
    # Ticks of 10 ms at most: 0.2 s of work reads as 0.15 s at least.
    assert 0.15 <= clock.spent([os.getpid()]) < 10
    # A process not there at the start counts from its birth; a gone one as 0.
    assert _jobs_versus.CpuClock([]).spent([os.getpid()]) >= 0.2
    assert _jobs_versus.cpu_seconds(2**22 + 1) == 0.0
