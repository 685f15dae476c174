"""The Autobahn TestSuite against the example server, through bench/autobahn.py.

The suite judges the WebSocket protocol of examples/websocket_connection.py
case by case (sections 1 to 10: framing, PING, reserved bits and opcodes,
fragmentation, UTF-8, the close handshake, 16 MiB messages). It runs on
Python 2.7 only: the script installs its pinned version the first time, runs
every case against ``examples/websocket_close_server.py --echo`` (about 20 s)
and exits with status 1 if a case FAILED. The test is skipped only where no
Python 2.7 exists.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"
SCRIPT = BENCH / "autobahn.py"
NO_PYTHON2 = 77  # the script's exit status when it finds no Python 2.7
SECTIONS = ["1", "2", "3", "4", "5", "6", "7", "9", "10"]  # there is no section 8
CASES = 301  # in sections 1 to 10 of autobahntestsuite 25.10.1
BEHAVIORS = ["OK", "NON-STRICT", "INFORMATIONAL", "UNIMPLEMENTED", "FAILED"]


def autobahn(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.realtime
@pytest.mark.autobahn
@pytest.mark.timeout(900)  # a first run installs the suite from PyPI
def test_sections_1_to_10_pass(tmp_path: Path) -> None:
    done = autobahn(
        "--output-dir",
        str(tmp_path),
        "--report-dir",
        str(tmp_path / "reports"),
        timeout=840,
    )
    if done.returncode == NO_PYTHON2:
        pytest.skip(f"the Autobahn TestSuite needs Python 2.7: {done.stderr.strip()}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    result = json.loads((tmp_path / "autobahn.json").read_text())
    assert result["cases_asked"] == [f"{section}.*" for section in SECTIONS]
    assert list(result["sections"]) == SECTIONS
    assert result["cases"] == CASES
    assert result["failed"] == 0
    for counts in result["sections"].values():
        assert counts["FAILED"] == counts["UNIMPLEMENTED"] == 0
    for case in result["not_ok"]:
        assert case["behavior"] in {"NON-STRICT", "INFORMATIONAL"}, case
        assert case["close"] in {"OK", "INFORMATIONAL"}, case
    # A CLOSE between the fragments of a message is answered with its code.
    assert "7.1.5" not in {case["case"] for case in result["not_ok"]}
    assert result["server_exit_status"] == 0
    assert (tmp_path / "reports" / "index.json").exists()
    assert (tmp_path / "autobahn.rst").read_text().count(".. list-table::") == 2


def test_a_failed_case_is_reported_and_sets_the_exit_status(tmp_path: Path) -> None:
    result = json.loads((BENCH / "results" / "autobahn.json").read_text())
    copy = tmp_path / "autobahn.json"
    copy.write_text(json.dumps(result))
    done = autobahn("--render", str(copy), timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "autobahn.rst").read_text() == (
        BENCH / "results" / "autobahn.rst"
    ).read_text()
    # The same run, had case 7.1.5 failed:
    result["failed"] = 1
    close = result["sections"]["7"]
    close["OK"] -= 1
    close["FAILED"] += 1
    result["not_ok"].append(
        {
            "case": "7.1.5",
            "behavior": "FAILED",
            "close": "WRONG CODE",
            "failed": True,
            "description": "Send message fragment1 followed by close then fragment",
            "expectation": "Clean close with normal code.",
            "result": "The close code should have been 1000 or empty",
        }
    )
    copy.write_text(json.dumps(result))
    done = autobahn("--render", str(copy), timeout=60)
    assert done.returncode == 1
    counts = " | ".join(str(close[behavior]) for behavior in BEHAVIORS)
    assert f"| 7 close handshake | {sum(close.values())} | {counts} |" in done.stdout
    assert "| 7.1.5 | FAILED | WRONG CODE |" in done.stdout
    assert "7.1.5" in (tmp_path / "autobahn.rst").read_text()


def test_without_python_2_7_the_script_says_so_and_exits_77(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": str(tmp_path), "PYENV_ROOT": str(tmp_path)},
    )
    assert done.returncode == NO_PYTHON2, done.stderr
    assert done.stderr == "no Python 2.7 found: give one with --python2\n"
