"""The jobs page's first example runs as printed: a worker that stays up."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.realtime

ROOT = Path(__file__).resolve().parent.parent.parent
PATIENCE = 60.0  # seconds any wait may take on a loaded machine


def example() -> str:
    page = (ROOT / "docs" / "jobs.rst").read_text()
    block = page.split(".. code-block:: python\n\n", 1)[1].split("\n\n\n", 1)[0]
    block = block.split("\nClients submit", 1)[0]
    return "\n".join(line.removeprefix("    ") for line in block.splitlines())


def test_the_jobs_page_example_closes_its_store_with_a_with_block() -> None:
    assert '    with open_store("sqlite:///jobs.db") as store:\n' in example()


def test_the_jobs_page_example_serves_until_sigterm(tmp_path: Path) -> None:
    (tmp_path / "service.py").write_text(example())
    process = subprocess.Popen(
        [sys.executable, "service.py"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        # Up and serving: the store exists and the program has not exited.
        deadline = time.monotonic() + PATIENCE
        while not (tmp_path / "jobs.db").exists() and time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()[0]
            time.sleep(0.05)
        time.sleep(1)
        assert process.poll() is None, process.communicate()[0]
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=PATIENCE)[0]
        assert process.returncode == 0, output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
