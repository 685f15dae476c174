"""The benchmark suite keeps working: its quick mode runs, reports and renders.

Nothing here checks a timing: the numbers of a quick run on a shared machine
mean little. What is checked is that every benchmark runs every variant, that
the results file says what it measured and where, and that the reports are
made from it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import docutils.core
import pytest
import trio

import trio_graceful

BENCH = Path(__file__).resolve().parent.parent / "bench"
RUN_ALL = BENCH / "run_all.py"

BENCHMARKS = [
    "spawn",
    "cancel_latency",
    "hard_cancel",
    "stop_fanout",
    "nested_shutdown",
    "websocket_drain",
    "instructions",
]

try:
    import anyio  # noqa: F401
except ImportError:
    ANYIO = False
else:
    ANYIO = True


def run_all(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RUN_ALL), *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run the quick suite once; return the directory with its three files."""
    directory = tmp_path_factory.mktemp("bench")
    done = run_all("--quick", "--output-dir", str(directory))
    assert done.returncode == 0, done.stderr
    return directory


@pytest.fixture
def results(quick_run: Path) -> dict:
    return json.loads((quick_run / "latest.json").read_text())


def test_results_describe_the_run_and_the_machine(results: dict) -> None:
    assert results["schema"] == 1
    assert results["settings"] == {
        "mode": "quick",
        "gc_enabled": True,
        "benchmarks": BENCHMARKS,
    }
    machine = results["machine"]
    assert machine["python"] == platform.python_version()
    assert machine["trio"] == trio.__version__
    assert machine["trio_graceful"] == trio_graceful.__version__
    assert machine["logical_cpus"] == os.cpu_count()
    assert machine["cpu"]
    assert (machine["anyio"] is not None) == ANYIO
    assert list(results["benchmarks"]) == BENCHMARKS


def test_every_variant_is_measured_against_trio_in_the_same_run(results: dict) -> None:
    peers = ["trio", "bundle", "anyio"] if ANYIO else ["trio", "bundle"]
    spawn = results["benchmarks"]["spawn"]
    assert list(spawn["variants"]) == peers
    if not ANYIO:
        assert spawn["missing"][0].startswith("anyio is not installed")
    for row in spawn["flat"] + spawn["trees"]:
        assert list(row["cpu_s"]) == list(row["wall_s"]) == peers
        # the ratios are taken against trio within each repetition
        assert row["cpu_ratio"]["trio"] == row["wall_ratio"]["trio"] == 1.0
        assert row["traced_ratio"]["trio"] == 1.0
        assert all(row["traced_peak_bytes"][v] > 0 for v in peers)
    for row in spawn["flat"]:
        assert row["cpu_s"]["bundle"]["n"] == 3
    latency = results["benchmarks"]["cancel_latency"]
    for row in latency["rows"]:
        assert row["latency_s"]["bundle.cancel"]["n"] == latency["samples"]
    hard = results["benchmarks"]["hard_cancel"]
    assert [(row["children"], row["phase"]) for row in hard["rows"]] == [
        (1, "whole ms"),
        (1, "random"),
        (10, "whole ms"),
        (10, "random"),
    ]
    fanout = results["benchmarks"]["stop_fanout"]["rows"]
    assert [row["children"] for row in fanout] == [100, 400]
    assert all(row["cpu_ratio"]["trio"] == 1.0 for row in fanout)
    nested = results["benchmarks"]["nested_shutdown"]["shapes"]
    assert [(s["fanout"], [r["leaves"] for r in s["rows"]]) for s in nested] == [
        (3, [9, 81])
    ]


def test_goals_cover_items_one_to_five(results: dict) -> None:
    items = {goal["item"].split(".")[0] for goal in results["goals"]}
    assert {"1", "2", "3", "4", "5"} <= items
    for goal in results["goals"]:
        assert isinstance(goal["met"], bool)


def test_websocket_drain_is_measured_against_both_peers(results: dict) -> None:
    servers = results["benchmarks"]["websocket_drain"]["servers"]
    assert list(servers) == ["trio_graceful", "websockets", "trio_websocket"]
    for server in servers.values():
        assert server["clean_closes"] == server["closes_expected"] > 0
    assert [goal["item"] for goal in results["goals"] if goal["item"][0] == "6"] == [
        "6. 50 idle WebSocket connections drained",
        "6. 50 idle WebSocket connections drained: signal to all clients closed, "
        "vs the websockets server",
    ]


def test_reports_are_rendered_again_from_the_results_file(
    quick_run: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "latest.json"
    copy.write_text((quick_run / "latest.json").read_text())
    done = run_all("--render", str(copy))
    assert done.returncode == 0, done.stderr
    markdown = (quick_run / "latest.md").read_text()
    assert (tmp_path / "latest.md").read_text() == markdown
    assert (tmp_path / "latest.rst").read_text() == (
        quick_run / "latest.rst"
    ).read_text()
    assert markdown.startswith("# trio_graceful benchmarks\n")
    assert "| goal | target | measured | verdict |" in markdown


def test_rst_report_is_valid_restructuredtext(quick_run: Path) -> None:
    text = "Title\n=====\n\n" + (quick_run / "latest.rst").read_text()
    # halt_level 2: any warning (a malformed table, say) raises
    doctree = docutils.core.publish_doctree(
        text, settings_overrides={"halt_level": 2, "report_level": 5}
    )
    tables = [node for node in doctree.findall() if node.tagname == "table"]
    headings = (quick_run / "latest.md").read_text().count("\n### ")
    assert len(tables) == headings >= 8  # goals, then two for item 1, one each


def test_unknown_benchmark_name_is_refused() -> None:
    done = run_all("--only", "spawn,nope")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "run_all.py: error: --only: no benchmark named 'nope'; choose from "
        + ", ".join(BENCHMARKS)
    )
