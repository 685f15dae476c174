"""Autobahn TestSuite: the example server's WebSocket protocol, sections 1 to 10.

The Autobahn TestSuite (``wstest -m fuzzingclient``) connects to
``examples/websocket_close_server.py --echo`` once per case and judges what
comes back: framing, PING and PONG, reserved bits and opcodes, fragmentation,
UTF-8, the close handshake, and messages up to 16 MiB (section 9). Sections
12 and 13 (permessage-deflate) are left out: the server offers no extension.

The suite runs on Python 2.7 only. This script finds an interpreter
(``--python2``, else pyenv's newest 2.7, else ``python2.7`` on the PATH),
installs the pinned suite for it the first time into a directory of its own
(the user site of a private ``PYTHONUSERBASE`` under ``~/.cache``, never
the user's), starts the server on a free port, runs the cases and stops the
server with SIGTERM. Every case gets a behaviour: OK, NON-STRICT (allowed,
though not the strictest answer), INFORMATIONAL (the RFC leaves it open),
UNIMPLEMENTED, FAILED.

Run ``python bench/autobahn.py [--cases '7.*' ...] [--report-dir DIR]``: it
prints the tables and writes ``bench/results/autobahn.json`` and
``autobahn.rst`` (those only for all of sections 1 to 10, or with
``--output-dir``); ``--report-dir`` keeps the suite's own HTML and JSON
reports. The exit status is 1 if a case FAILED, and 77 if there is no
Python 2.7 (the tests skip then). ``--render`` makes the tables again from
the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import _common
import _render

TITLE = "Autobahn TestSuite, sections 1 to 10, against the example server"
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SERVER = ROOT / "examples" / "websocket_close_server.py"

SUITE_VERSION = "25.10.1"
REQUIREMENTS = (
    f"autobahntestsuite=={SUITE_VERSION}",
    # everything it pulls in, pinned, so that every run installs the same
    "attrs==21.4.0",
    "autobahn[accelerate,twisted]==0.10.9",
    "Automat==22.10.0",
    "cffi==1.15.1",
    "constantly==15.1.0",
    "cryptography==3.3.2",
    "enum34==1.1.10",
    "hyperlink==21.0.0",
    "idna==2.10",
    "incremental==16.10.1",
    "ipaddress==1.0.23",
    "Jinja2==2.11.3",
    "klein==17.10.0",
    "linecache2==1.0.0",
    "MarkupSafe==1.1.1",
    "pyasn1==0.5.1",
    "pyasn1-modules==0.3.0",
    "pycparser==2.21",
    "PyHamcrest==1.10.1",
    "pyOpenSSL==19.1.0",
    "service-identity==18.1.0",
    "setuptools==44.0.0",
    "six==1.16.0",
    "traceback2==1.4.0",
    "Twisted==19.10.0",
    "txaio==2.1.0",
    "typing==3.10.0.0",
    "ujson==2.0.3",
    "unittest2==1.1.0",
    "Werkzeug==1.0.1",
    "wsaccel==0.6.6",
    "zope.interface==4.6.0",
)

PIP_OPTIONS = ("--quiet", "--no-warn-script-location", "--disable-pip-version-check")

SECTIONS = {
    "1": "framing",
    "2": "PING and PONG",
    "3": "reserved bits",
    "4": "opcodes",
    "5": "fragmentation",
    "6": "UTF-8",
    "7": "close handshake",
    "9": "limits and performance",
    "10": "miscellaneous",
}
ALL_CASES = [f"{section}.*" for section in SECTIONS]
BEHAVIORS = ("OK", "NON-STRICT", "INFORMATIONAL", "UNIMPLEMENTED", "FAILED")
ACCEPTED = {"OK", "NON-STRICT", "INFORMATIONAL"}
CLEAN_CLOSE = {"OK", "INFORMATIONAL", "UNIMPLEMENTED"}

NO_PYTHON2 = 77
"""The exit status when no Python 2.7 is found (77 means "skipped" to
automake's test drivers, as it does to tests/examples/test_autobahn.py)."""
SERVER_START_TIMEOUT = 30.0
SUITE_TIMEOUT = 900.0
"""Seconds the cases may take in all: a bound against hangs (about 20 s here)."""


class SuiteError(RuntimeError):
    """The suite could not be installed or run; the message says why."""


def find_python2(explicit: str | None = None) -> Path | None:
    """The Python 2.7 interpreter to run the suite with, or None."""
    if explicit is not None:
        return Path(explicit)
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    found = sorted(
        pyenv.glob("versions/2.7.*/bin/python2.7"),
        key=lambda path: [int(part) for part in re.findall(r"\d+", path.parts[-3])],
    )
    if found:
        return found[-1]
    on_path = shutil.which("python2.7")
    return None if on_path is None else Path(on_path)


def suite_home() -> Path:
    """The private ``PYTHONUSERBASE`` the pinned suite is installed under."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "trio-graceful" / f"autobahntestsuite-{SUITE_VERSION}-py2.7"


def suite_environment(home: Path) -> dict[str, str]:
    """The environment of Python 2 with only the suite's user site added."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE"}
    }
    env["PYTHONUSERBASE"] = str(home)
    return env


def install_suite(python2: Path, home: Path) -> Path:
    """Install the pinned suite under ``home`` unless it is there; return wstest."""
    marker = home / "requirements.txt"
    wanted = "\n".join(REQUIREMENTS) + "\n"
    wstest = home / "bin" / "wstest"
    if wstest.exists() and marker.exists() and marker.read_text() == wanted:
        return wstest
    print(f"installing the Autobahn TestSuite into {home} ...", file=sys.stderr)
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    done = subprocess.run(
        [python2, "-m", "pip", "install", "--user", *PIP_OPTIONS, *REQUIREMENTS],
        env=suite_environment(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not wstest.exists():
        raise SuiteError(
            f"could not install the Autobahn TestSuite with {python2} "
            f"(pip exited with {done.returncode}):\n{done.stdout}"
        )
    marker.write_text(wanted)  # last: a broken install is tried again
    return wstest


def python_version(python: Path) -> str:
    return subprocess.run(
        [python, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def start_server(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start the example server in echo mode; return it and the URL it serves."""
    with log.open("wb") as stderr:
        server = subprocess.Popen(
            [sys.executable, SERVER, "--echo", "--port", "0"], stderr=stderr
        )
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while time.monotonic() < deadline and server.poll() is None:
        if match := re.search(r"listening on (ws://\S+)", log.read_text()):
            return server, match.group(1)
        time.sleep(0.05)
    server.kill()
    server.wait()
    raise SuiteError(f"the server did not start:\n{log.read_text()}")


def run_cases(
    python2: Path, wstest: Path, url: str, cases: list[str], reports: Path
) -> dict[str, Any]:
    """Run the cases against ``url``; return the suite's index of results."""
    spec = {
        "outdir": str(reports),
        "servers": [{"agent": "trio_graceful", "url": url}],
        "cases": cases,
        "exclude-cases": [],
        "exclude-agent-cases": {},
    }
    (reports / "spec.json").write_text(json.dumps(spec, indent=1))
    with (reports / "wstest.log").open("wb") as log:
        try:
            done = subprocess.run(
                [python2, wstest, "-m", "fuzzingclient", "-s", "spec.json"],
                cwd=reports,
                env=suite_environment(wstest.parent.parent),
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=SUITE_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SuiteError(f"wstest ran for {SUITE_TIMEOUT:g} s; stopped") from None
    index = reports / "index.json"
    if done.returncode != 0 or not index.exists():
        log_text = (reports / "wstest.log").read_text(errors="replace")
        raise SuiteError(f"wstest exited with {done.returncode}:\n{log_text[-4000:]}")
    results: dict[str, Any] = json.loads(index.read_text())["trio_graceful"]
    if not results:
        raise SuiteError(f"no case matched {' '.join(cases)}")
    return results


def stop_server(server: subprocess.Popen[bytes]) -> int:
    """SIGTERM, as an orchestrator would; return the exit status."""
    server.send_signal(signal.SIGTERM)
    try:
        return server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
        raise SuiteError("the server did not exit within 30 s of SIGTERM") from None


def case_key(case: str) -> tuple[int, ...]:
    return tuple(int(part) for part in case.split("."))


def failed(outcome: dict[str, Any]) -> bool:
    return (
        outcome["behavior"] not in ACCEPTED and outcome["behavior"] != "UNIMPLEMENTED"
    ) or outcome["behaviorClose"] not in CLEAN_CLOSE


def _plain(html: str) -> str:
    """The suite's HTML fragment as one line of text."""
    text = re.sub(r"<[^>]+>", "", re.sub(r"<br\s*/?>", " ", html))
    return " ".join(text.split())


def summarize(index: dict[str, Any], reports: Path) -> dict[str, Any]:
    """Counts per section and behaviour; every case that is not OK, named."""
    sections: dict[str, Counter[str]] = {}
    not_ok = []
    for case in sorted(index, key=case_key):
        outcome = index[case]
        section = case.split(".")[0]
        sections.setdefault(section, Counter())[outcome["behavior"]] += 1
        if outcome["behavior"] != "OK" or outcome["behaviorClose"] != "OK":
            report = json.loads((reports / outcome["reportfile"]).read_text())
            not_ok.append(
                {
                    "case": case,
                    "behavior": outcome["behavior"],
                    "close": outcome["behaviorClose"],
                    "failed": failed(outcome),
                    "description": _plain(report["description"]),
                    "expectation": _plain(report["expectation"]),
                    "result": _plain(report["result"]),
                }
            )
    slowest = sorted(index, key=lambda case: -index[case]["duration"])[:5]
    return {
        "cases": len(index),
        "failed": sum(map(failed, index.values())),
        "sections": {
            section: {b: counts[b] for b in BEHAVIORS}
            for section, counts in sections.items()
        },
        "not_ok": not_ok,
        "slowest_ms": {case: index[case]["duration"] for case in slowest},
    }


def run(
    *, cases: list[str], python2: Path, reports: Path, home: Path | None = None
) -> dict[str, Any]:
    """Install if needed, run the cases; return the results as a JSON-ready dict."""
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    t0 = time.perf_counter()
    version = python_version(python2)
    if not version.startswith("2.7."):
        raise SuiteError(f"the suite runs on Python 2.7, and {python2} is {version}")
    wstest = install_suite(python2, suite_home() if home is None else home)
    load = _common.load_average()
    server, url = start_server(reports / "server.log")
    try:
        t1 = time.perf_counter()
        index = run_cases(python2, wstest, url, cases, reports)
        wstest_s = time.perf_counter() - t1
    finally:
        exit_status = stop_server(server)
    return {
        "title": TITLE,
        "machine": _common.machine(),
        "python2": version,
        "autobahntestsuite": SUITE_VERSION,
        "started": started,
        "load_average": {"start": load, "end": _common.load_average()},
        "cases_asked": cases,
        "duration_s": time.perf_counter() - t0,
        "wstest_s": wstest_s,
        "server_exit_status": exit_status,
        **summarize(index, reports),
    }


def tables(result: dict[str, Any]) -> list[_common.Table]:
    """Counts per section, then the cases that are not plainly OK."""
    totals: Counter[str] = Counter()
    rows = []
    for section, counts in result["sections"].items():
        totals.update(counts)
        name = SECTIONS.get(section, "")
        rows.append(
            [f"{section} {name}", str(sum(counts.values()))]
            + [str(counts[b]) for b in BEHAVIORS]
        )
    rows.append(["all", str(result["cases"])] + [str(totals[b]) for b in BEHAVIORS])
    keys = ("case", "behavior", "close", "description", "expectation", "result")
    cases = [[c[key] for key in keys] for c in result["not_ok"]]
    return [
        _common.Table(
            title=f"{TITLE}: behaviour per section",
            columns=["section", "cases", *BEHAVIORS],
            rows=rows,
            notes=[
                f"{result['cases']} cases in {result['wstest_s']:.0f} s; the "
                f"server exited with status {result['server_exit_status']} "
                "on SIGTERM at the end."
            ],
        ),
        _common.Table(
            title="Cases not plainly OK, and why (the suite's words)",
            columns=["case", "behaviour", "close", "the case", "expected", "verdict"],
            rows=cases or [["none", *[""] * 5]],
        ),
    ]


def render(result: dict[str, Any]) -> str:
    """The report in reStructuredText, written next to the JSON."""
    m = result["machine"]
    measured = (
        f"Measured {result['started']} on {m['cpu']} ({m['logical_cpus']} logical "
        f"CPUs, shared with other work), autobahntestsuite "
        f"{result['autobahntestsuite']} on Python {result['python2']}; the "
        f"server on Python {m['python']}, Trio {m['trio']}, websockets "
        f"{m['websockets']}."
    )
    parts = [
        ".. This file is generated by bench/autobahn.py from autobahn.json; "
        "do not edit it.\n",
        measured + "\n",
        *(_render.rst_table(t, underline="~") for t in tables(result)),
    ]
    return "\n".join(parts)


def write(result: dict[str, Any], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "autobahn.json").write_text(json.dumps(result, indent=1) + "\n")
    (directory / "autobahn.rst").write_text(render(result))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--cases",
        nargs="+",
        default=ALL_CASES,
        help="the cases to run, as the suite names them (default: 1.* to 10.*)",
    )
    parser.add_argument("--python2", help="the Python 2.7 to run the suite with")
    parser.add_argument(
        "--output-dir",
        type=Path,
        help="where to write the results (default: bench/results, and nowhere "
        "when --cases names fewer, so that a partial run never replaces them)",
    )
    parser.add_argument(
        "--report-dir", type=Path, help="keep the suite's own reports here"
    )
    parser.add_argument("--render", type=Path, metavar="RESULTS_JSON")
    args = parser.parse_args(argv)
    if args.render is not None:
        result = _render.render_again(args.render, render)
    else:
        python2 = find_python2(args.python2)
        if python2 is not None and not python2.exists():
            parser.error(f"--python2 must be an interpreter, not {args.python2!r}")
        if python2 is None:
            print("no Python 2.7 found: give one with --python2", file=sys.stderr)
            return NO_PYTHON2
        with tempfile.TemporaryDirectory(prefix="autobahn-") as temporary:
            reports = args.report_dir or Path(temporary)
            reports.mkdir(parents=True, exist_ok=True)
            try:
                result = run(cases=args.cases, python2=python2, reports=reports)
            except SuiteError as exc:
                parser.exit(2, f"{parser.prog}: {exc}\n")
        full = args.cases == ALL_CASES
        directory = args.output_dir or (RESULTS if full else None)
        if directory is not None:
            write(result, directory)
        print(json.dumps(result, indent=1))
    for table in tables(result):
        print(_render.markdown_table(table))
    return 1 if result["failed"] or result["server_exit_status"] != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
