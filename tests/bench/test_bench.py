"""The benchmark suite keeps working: its quick mode runs, reports and renders.

Nothing here checks a timing: the numbers of a quick run on a shared machine
mean little. What is checked is that every benchmark runs every variant, that
the results file says what it measured and where, and that the reports are
made from it.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import docutils.core
import pytest
import trio

import trio_graceful
from trio_graceful.jobs import _client

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"
RUN_ALL = BENCH / "run_all.py"


def load_bench(name: str) -> ModuleType:
    """Import a benchmark script, to call its report functions."""
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))
    return importlib.import_module(name)


BENCHMARKS = [
    "spawn",
    "cancel_latency",
    "hard_cancel",
    "stop_fanout",
    "nested_shutdown",
    "websocket_drain",
    "websocket_throughput",
    "instructions",
    "asgi_drain",
    "asgi_throughput",
    "workers_reload",
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
        # the ASGI benchmarks start nine server processes each
        timeout=240,
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


def test_goals_cover_items_one_to_eleven(results: dict) -> None:
    items = {goal["item"].split(".")[0] for goal in results["goals"]}
    assert {"1", "2", "3", "4", "5", "6", "7", "9", "10", "11"} <= items
    for goal in results["goals"]:
        assert isinstance(goal["met"], bool)


def test_websocket_drain_is_measured_against_both_peers(results: dict) -> None:
    drain = results["benchmarks"]["websocket_drain"]
    # the quick run's scale case is 100 connections, after the first case's 50
    assert (drain["connections"], drain["repetitions"]) == (50, 1)
    scale = drain["scale"]
    assert (scale["connections"], scale["repetitions"]) == (100, 1)
    assert drain["grace_s"] == 5
    for case in (drain, scale):
        servers = case["servers"]
        assert list(servers) == ["trio_graceful", "websockets", "trio_websocket"]
        for server in servers.values():
            assert server["clean_closes"] == server["closes_expected"]
            assert server["closes_expected"] == case["connections"]
            assert server["all_closed_s"]["max"] > 0
        assert list(case["ratios_of_trio_graceful_to"]) == [
            "websockets",
            "trio_websocket",
        ]
    items = [goal["item"] for goal in results["goals"] if goal["item"][0] == "6"]
    assert items == [
        f"6. {n} idle WebSocket connections drained{what}"
        for n in (50, 100)
        for what in (
            "",
            ": well within --grace 5, signal to all clients closed, slowest run",
            ": signal to all clients closed, vs the websockets server",
        )
    ]


def test_websocket_throughput_pairs_the_example_with_each_peer(
    results: dict,
) -> None:
    throughput = results["benchmarks"]["websocket_throughput"]
    assert (throughput["connections"], throughput["repetitions"]) == (20, 1)
    servers = throughput["servers"]
    assert list(servers) == ["example", "sansio", "trio_websocket", "websockets"]
    for server in servers.values():
        assert server["requests_per_s"]["n"] == 1
        assert server["requests_per_s"]["median"] > 0
        assert server["server_cpu_us_per_request"]["n"] == 1
    assert list(throughput["ratios"]) == [
        "example/sansio",
        "example/websockets",
        "trio_websocket/websockets",
        "sansio/websockets",
    ]
    # with one repetition, the paired ratio is the ratio of the two runs
    ours, theirs = servers["example"], servers["sansio"]
    assert throughput["ratios"]["example/sansio"]["requests_per_s"] == pytest.approx(
        ours["requests_per_s"]["median"] / theirs["requests_per_s"]["median"]
    )
    goals = [goal for goal in results["goals"] if goal["item"][0] == "7"]
    assert [(goal["item"], goal["target"]) for goal in goals] == [
        (
            "7. WebSocket throughput, 20 connections: what trio_graceful adds "
            "per request",
            "server cost per request ≤ 1.05x the same code without it",
        ),
        (
            "7. WebSocket throughput, 20 connections: the example at least as "
            "fast as the websockets server",
            "server cost per request ≤ 1.00x",
        ),
    ]
    # a quick run counts no instructions: the goals are judged on CPU time
    assert throughput["instructions_per_request"] is None
    cpu = throughput["ratios"]["example/websockets"]["server_cpu_us_per_request"]
    assert goals[1]["met"] == (cpu <= 1.0)


def test_websocket_throughput_goals_are_judged_on_instructions_when_counted(
    results: dict,
) -> None:
    throughput = load_bench("bench_websocket_throughput")
    result = {
        **results["benchmarks"]["websocket_throughput"],
        "instructions_per_request": {
            "example": 210_000.0,
            "sansio": 200_000.0,
            "websockets": 220_000.0,
        },
    }
    goals = throughput.goals(result)
    assert [goal.measured.split(";")[0] for goal in goals] == [
        "instructions 1.05x",
        "instructions 0.95x",
    ]
    assert [goal.met for goal in goals] == [True, True]
    result["instructions_per_request"]["example"] = 221_000.0
    assert [goal.met for goal in throughput.goals(result)] == [False, False]
    [counted, _] = throughput.tables(result)
    assert counted.rows[-1] == ["ratio sansio/websockets", "0.91x"]


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
    # goals, then two for item 1, one each, and two for item 6 (its scale case)
    assert len(tables) == headings >= 10


def test_unknown_benchmark_name_is_refused() -> None:
    done = run_all("--only", "spawn,nope")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "run_all.py: error: --only: no benchmark named 'nope'; choose from "
        + ", ".join(BENCHMARKS)
    )


def run_script(name: str, *args: str) -> tuple[str, dict]:
    """Run one benchmark script alone; return its report and its results."""
    done = subprocess.run(
        [sys.executable, str(BENCH / name), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report, _, results = done.stdout.partition("\n{")
    return report, json.loads("{" + results)


def test_websocket_throughput_runs_alone_with_its_own_options() -> None:
    report, results = run_script(
        "bench_websocket_throughput.py",
        *("--seconds", "0.2", "--repetitions", "2", "--connections", "3"),
        "--no-instructions",
    )
    assert (results["seconds"], results["repetitions"]) == (0.2, 2)
    assert results["connections"] == 3
    for server in results["servers"].values():
        assert server["requests_per_s"]["n"] == 2
    assert report.startswith(
        "### 7. WebSocket throughput: requests of no work, kept in flight "
        "(3 connections)\n"
    )
    assert "\n### Goals\n" in report


def test_websocket_drain_measures_only_the_case_asked_for() -> None:
    report, results = run_script(
        "bench_websocket_drain.py", "--connections", "3", "--repetitions", "2"
    )
    assert (results["connections"], results["repetitions"]) == (3, 2)
    assert results["scale"] is None
    for server in results["servers"].values():
        assert server["clean_closes"] == server["closes_expected"] == 6
    assert report.count("### ") == 2  # one table, then the goals
    assert "| 6. 3 idle WebSocket connections drained: well within --grace 5" in report


ASGI_SERVERS = ["trio_graceful", "hypercorn", "uvicorn"]


def test_asgi_drain_measures_every_server_in_every_case(results: dict) -> None:
    drain = results["benchmarks"]["asgi_drain"]
    assert (drain["grace_s"], drain["work_ms"]) == (5, [10, 800])
    assert [case["clients"] for case in drain["drains"]] == [8, 16]
    assert drain["idle"]["connections"] == 50
    for case in [*drain["drains"], drain["idle"]]:
        assert case["repetitions"] == 1
        assert list(case["servers"]) == ASGI_SERVERS
        assert list(case["ratios_of_trio_graceful_to"]) == ["hypercorn", "uvicorn"]
        for server in case["servers"].values():
            assert server["runs"] == 1
            assert server["exit_s"]["median"] > 0
    for case in drain["drains"]:
        for server in case["servers"].values():
            # every connection ended, and was counted once
            assert (
                sum(
                    server[f"connections_{n}"]["total"]
                    for n in ("close", "idle", "none")
                )
                == case["clients"]
            )
            assert server["answered"]["total"] > 0
    goals = [goal for goal in results["goals"] if goal["item"].startswith("9.")]
    assert [(goal["item"], goal["target"]) for goal in goals] == [
        *(
            (
                f"9. ASGI drain, {n} keep-alive clients: requests dropped, "
                "connections closed without Connection: close",
                "0 and 0 in every run; exit 0",
            )
            for n in (8, 16)
        ),
        (
            "9. ASGI drain, 50 idle keep-alive connections: SIGTERM to all "
            "closed, vs Hypercorn alone",
            "≤ 1.00x",
        ),
    ]


def test_asgi_drain_goals_follow_the_counts(results: dict) -> None:
    bench = load_bench("bench_asgi_drain")
    result = json.loads(json.dumps(results["benchmarks"]["asgi_drain"]))
    [case, _] = result["drains"]
    ours = case["servers"]["trio_graceful"]
    ours["dropped"]["total"] = ours["connections_none"]["total"] = 0
    ours["exit_statuses"] = [0]
    result["idle"]["ratios_of_trio_graceful_to"]["hypercorn"]["all_closed_s"] = 1.0
    first, _, idle = bench.goals(result)
    assert (first.measured, first.met) == ("0 and 0 in 1 run; exit 0", True)
    assert idle.met
    ours["dropped"]["total"] = 1
    ours["exit_statuses"] = [0, -15]
    result["idle"]["ratios_of_trio_graceful_to"]["hypercorn"]["all_closed_s"] = 1.01
    first, _, idle = bench.goals(result)
    assert (first.measured, first.met) == ("1 and 0 in 1 run; exit 0, -15", False)
    assert idle.measured.startswith("1.01x (exit ")
    assert not idle.met


def test_asgi_throughput_pairs_trio_graceful_with_each_server(results: dict) -> None:
    throughput = results["benchmarks"]["asgi_throughput"]
    assert (throughput["connections"], throughput["repetitions"]) == (20, 1)
    assert list(throughput["servers"]) == ASGI_SERVERS
    for server in throughput["servers"].values():
        assert server["requests_per_s"]["median"] > 0
        assert server["server_cpu_us_per_request"]["n"] == 1
    assert list(throughput["ratios"]) == [
        "trio_graceful/hypercorn",
        "trio_graceful/uvicorn",
    ]
    # a quick run counts no instructions: the goal is judged on CPU time
    assert throughput["instructions_per_request"] is None
    [goal] = [g for g in results["goals"] if g["item"].startswith("10.")]
    cpu = throughput["ratios"]["trio_graceful/hypercorn"]["server_cpu_us_per_request"]
    assert goal["target"] == "≤ 1.05x"
    assert goal["met"] == (cpu <= 1.05)


def test_workers_reload_runs_in_the_suite_with_its_goals(results: dict) -> None:
    workers = results["benchmarks"]["workers_reload"]
    assert (workers["mode"], workers["rounds"]) == ("quick", 1)
    assert list(workers["versions"]) == ["trio_graceful"]
    assert workers["missing"] == []
    assert [(r["workers"], r["burst"]) for r in workers["throughput"]] == [
        (1, False),
        (2, False),
        (2, True),
    ]
    goals = [g for g in results["goals"] if g["item"].startswith("11.")]
    assert [g["target"] for g in goals] == ["0/0/0/0", "≥ 1.80x"]
    assert goals[0]["met"]  # a quick reload loses nothing either


def test_asgi_throughput_goal_is_judged_on_instructions_when_counted(
    results: dict,
) -> None:
    bench = load_bench("bench_asgi_throughput")
    result = {
        **results["benchmarks"]["asgi_throughput"],
        "instructions_per_request": {
            "trio_graceful": 1_050_000.0,
            "hypercorn": 1_000_000.0,
            "uvicorn": 700_000.0,
        },
    }
    [goal] = bench.goals(result)
    assert goal.measured.startswith("instructions 1.05x; CPU time ")
    assert goal.met
    result["instructions_per_request"]["trio_graceful"] = 1_060_000.0
    [goal] = bench.goals(result)
    assert not goal.met
    counted, _ = bench.tables(result)
    assert counted.rows[-2:] == [
        ["ratio trio_graceful/hypercorn", "1.06x"],
        ["ratio trio_graceful/uvicorn", "1.51x"],
    ]


def test_asgi_connections_are_classified_by_their_last_response() -> None:
    clients = load_bench("_asgi_clients")

    def ended(*answers: tuple[bool, float], dropped: int = 0) -> object:
        connection = clients.ClientConnection(stream=None)
        connection.answers = [
            clients.Answer(i, 200, close, at) for i, (close, at) in enumerate(answers)
        ]
        for i in range(dropped):
            connection.outstanding.append(clients.Sent(100 + i, 0, True))
        connection.outstanding.append(clients.Sent(200, 0, False))  # after the FIN
        return connection

    signalled_at = 10.0
    assert clients.notice(ended((False, 9.0), (True, 11.0)), signalled_at) == "close"
    assert clients.notice(ended((False, 9.0)), signalled_at) == "idle"
    assert clients.notice(ended(), signalled_at) == "idle"
    # answered after the signal without Connection: close, then closed
    assert clients.notice(ended((False, 11.0)), signalled_at) == "none"
    # idle before the signal, but with a request it had received unanswered
    assert clients.notice(ended((False, 9.0), dropped=1), signalled_at) == "none"


def test_import_costs_are_measured_against_trio_and_judged() -> None:
    script = str(BENCH / "bench_import.py")
    done = subprocess.run(
        [sys.executable, script, "--repetitions", "1", "--json"],
        capture_output=True,
        text=True,
        # fourteen fresh interpreters, on a machine that may be busy
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report, _, text = done.stdout.partition("\n{")
    results = json.loads("{" + text)
    variants = results["variants"]
    assert results["repetitions"] == 1
    assert list(variants) == [
        "import trio",
        "import trio_graceful",
        "import trio_graceful.jobs",
        "first use of open_bundle",
        "first use of run",
        "jobs_service.py status",
        "jobs_service.py submit",
    ]
    assert variants["import trio"]["cpu_over_trio_s"] == 0
    for entry in variants.values():
        assert entry["cpu_s"]["n"] == entry["wall_s"]["n"] == 1
    assert report.startswith("### Importing: fresh processes\n")
    goals = report.partition("\n### Goals\n")[2]
    for variant, target in [
        ("import trio_graceful", 30),
        ("import trio_graceful.jobs", 40),
        ("jobs_service.py status", 80),
        ("jobs_service.py submit", 80),
    ]:
        assert f"| {variant}: CPU time over 'import trio' | <= {target} ms | " in goals
    assert goals.count("| met |") + goals.count("| MISSED |") == 4


def test_import_bench_refuses_no_repetitions() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "bench_import.py"), "--repetitions", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "bench_import.py: error: repetitions must be >= 1, not 0"
    )


@pytest.mark.realtime
@pytest.mark.parametrize("pin", [False, True], ids=["free", "pinned"])
def test_the_jobs_bench_runs_every_variant_to_the_last_job(
    tmp_path: Path, pin: bool
) -> None:
    bench = load_bench("bench_jobs")
    url = f"sqlite:///{tmp_path}/bench.db"
    variants = [
        "library",
        "library, offload=False",
        "hand-written",
        bench.BUSY_HANDLER,
        bench.ON_TRIO,
    ]
    for variant in variants:
        rate = bench.throughput(url, variant, 2, 30, pin=pin)
        # The rate is measured to the last of the 30 jobs, each run once.
        assert rate > 0
        q = bench.queries(url)
        try:
            assert bench.count_ended(q) == 30
            events = _client.events(q, None)
        finally:
            q.close()
        claims = [e for e in events if e.target.value == "running"]
        assert len(claims) == len({e.job for e in claims}) == 30
