"""A command line that cannot start says why in one line, and exits non-zero.

Each example runs as a real process whose startup fails the way an
operator's mistake makes it fail: a port already in use, an address of
another host, a state file that cannot be read or saved. Its stderr is
exactly one line, with no traceback (the runner logs that at DEBUG).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.examples import EXAMPLES

pytestmark = pytest.mark.realtime


@pytest.fixture(scope="module")
def taken() -> Iterator[int]:
    """A loopback port that something listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _fails(example: str, *args: str) -> str:
    """Run ``example`` with ``args``; return its one line of stderr before the last.

    The last says the status, and why.
    """
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / example), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) in (1, 2), done.stderr
    if len(lines) == 2:  # an example that logs at INFO
        assert lines[1].endswith("exiting with status 1: startup failed"), lines
    return lines[0]


IN_USE = "OSError: [Errno 98] Address already in use"


def test_asgi_service_on_a_port_in_use(taken: int) -> None:
    line = _fails("asgi_service.py", "--port", str(taken))
    assert line == (
        "trio_graceful.runner: startup failed: OSError: [Errno 98] cannot listen "
        f"on 127.0.0.1:{taken}: Address already in use"
    )


def test_quart_service_on_a_port_in_use(taken: int) -> None:
    line = _fails("quart_service.py", "--port", str(taken))
    assert line.startswith(
        "trio_graceful.runner: startup failed: OSError: [Errno 98] cannot listen "
    )


def test_tcp_echo_server_on_a_port_in_use(taken: int) -> None:
    assert _fails("tcp_echo_server.py", str(taken)) == f"startup failed: {IN_USE}"


def test_websocket_close_server_on_a_port_in_use(taken: int) -> None:
    line = _fails("websocket_close_server.py", "--port", str(taken))
    assert line.endswith(
        f"websocket_close_server ERROR: cannot listen on 127.0.0.1 port {taken}: "
        "[Errno 98] Address already in use"
    )


def test_websocket_close_server_on_an_address_of_another_host() -> None:
    # TEST-NET-1 (RFC 5737): no interface of this machine has it.
    line = _fails("websocket_close_server.py", "--host", "192.0.2.1", "--port", "0")
    assert line.endswith(
        "websocket_close_server ERROR: cannot listen on 192.0.2.1 port 0: "
        "[Errno 99] Cannot assign requested address"
    )


def test_mcp_server_with_its_health_port_in_use(taken: int) -> None:
    line = _fails("mcp_server.py", "--health-port", str(taken))
    assert line == (
        f"ERROR trio_graceful.runner: startup failed: [Errno 98] the health "
        f"endpoint cannot listen on port {taken} of every interface: Address "
        f"already in use"
    )


def test_stdio_service_with_a_state_file_it_cannot_read(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text("{not json")
    line = _fails("stdio_service.py", "--state", str(state))
    assert line.startswith(
        "ERROR trio_graceful.runner: startup failed: json.decoder.JSONDecodeError: "
    )


def test_stdio_service_with_no_folder_for_its_state(tmp_path: Path) -> None:
    state = tmp_path / "missing" / "state.json"
    line = _fails("stdio_service.py", "--state", str(state))
    assert line == (
        "ERROR trio_graceful.runner: startup failed: FileNotFoundError: "
        f"no folder {str(state.parent)!r} for the state file"
    )
