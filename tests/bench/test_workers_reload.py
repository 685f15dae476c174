"""The benchmark of several worker processes keeps working: its quick mode runs.

``bench/bench_workers_reload.py --quick``: trio_graceful's two workers,
8 clients, two reloads, then a second of throughput with 1 and 2 workers.
Nothing here checks a timing (the numbers of a quick run on a shared
machine mean little); what is checked is that it runs, loses nothing, and
writes its results and its table, and that the table has a row for each
server of a full run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import docutils.core
import pytest

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from bench_workers_reload import COMMANDS, goals, render  # noqa: E402

pytestmark = pytest.mark.realtime


def test_the_quick_run_loses_nothing_and_writes_its_results(tmp_path: Path):
    output = tmp_path / "workers.json"
    script = str(BENCH / "bench_workers_reload.py")
    done = subprocess.run(
        [sys.executable, script, "--quick", "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(output.read_text())
    assert results["mode"] == "quick"
    assert set(results["versions"]) == {"trio_graceful"}
    [reloads] = results["reloads"]
    assert reloads["server"] == "trio_graceful"
    assert reloads["answered"] > 0
    lost = {k: reloads[k] for k in ("dropped", "refused", "reset", "not_200")}
    assert lost == dict.fromkeys(lost, 0)
    assert reloads["exit"] == 0
    assert len(reloads["reload_s"]) == 2
    assert [
        (r["workers"], r["burst"], r["requests"] > 0) for r in results["throughput"]
    ] == [(1, False, True), (2, False, True), (2, True, True)]
    for row in results["throughput"]:
        # Which worker answers how much is the machine's to say, not a test's.
        assert 1 <= len(row["worker_shares"]) <= row["workers"]
        assert sum(row["worker_shares"]) == pytest.approx(1, abs=0.01)
        assert row["server_cpu_ms_per_request"] > 0
    table = output.with_suffix(".rst").read_text()
    assert docutils.core.publish_doctree(table).astext().count("trio_graceful") == 2


def test_the_table_has_a_row_for_each_server_of_a_full_run():
    reloads = [
        {
            "server": kind,
            "clients": 40,
            "answered": 1000,
            **dict.fromkeys(("dropped", "refused", "reset", "not_200"), 0),
            "reload_s": [1.5, 1.25] if kind == "trio_graceful" else [],
        }
        for kind in COMMANDS
    ]
    throughput = [
        {
            "server": kind,
            "workers": workers,
            "burst": burst,
            "round": number,
            "per_second": (500.0 + 100 * number) * workers,
            "worker_shares": [0.75, 0.25] if burst else [1 / workers] * workers,
            "server_cpu_ms_per_request": 1.5,
            "supervisor_cpu_ms_per_s": 1.25,
        }
        for number in range(2)
        for kind in COMMANDS
        for workers, burst in ((1, False), (2, False), (2, True))
    ]
    results = {
        "versions": dict.fromkeys(COMMANDS, "1.0"),
        "rounds": 2,
        "reloads": reloads,
        "throughput": throughput,
    }
    text = docutils.core.publish_doctree(render(results)).astext()
    for kind in COMMANDS:
        assert text.count(f"{kind} 1.0") == 2, kind
    assert "1.25-1.5" in text
    # Medians of the two rounds, and their range.
    assert text.count("550 (500-600)") == len(COMMANDS)
    assert text.count("1,100 (1,000-1,200)") == 2 * len(COMMANDS)
    assert text.count("2.00x") == len(COMMANDS)
    assert text.count("50% / 75%") == len(COMMANDS)
    [lost, scaling] = goals(results)
    assert (lost.measured, lost.met) == ("0/0/0/0", True)
    assert (scaling.measured, scaling.met) == ("2.00x", True)
