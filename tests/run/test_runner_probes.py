"""What `trio_graceful.run` tells the outside (probes and systemd), stage by stage.

The programs run in-process on a MockClock, and the probes are real HTTP
requests over loopback, the notifications real datagrams on a real
``$NOTIFY_SOCKET``. The clock stands still (no autojump) where a probe must
see a stage, and is moved by hand past the drain delay.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

import trio_graceful
from trio_graceful import STOP, ExitCodes, LifecycleState, current_runner

S = LifecycleState


async def probe(path: str) -> tuple[int, str]:
    """GET ``path`` from the program's health endpoint; the status and the body."""
    address = current_runner().health_address
    assert address is not None
    return await probe_at(address, path)


async def probe_at(address: tuple[str, int], path: str) -> tuple[int, str]:
    """GET ``path`` as a kubelet does, on a new connection; the status and the body."""
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        request = f"GET {path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n"
        await stream.send_all(request.encode())
        data = b""
        while chunk := await stream.receive_some():
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def still_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock()  # time moves only when jumped


def test_the_health_endpoint_through_every_stage():
    clock = still_clock()
    seen: list[tuple[str, int, str]] = []

    async def look(stage: str) -> None:
        for path in ("/livez", "/readyz"):
            status, body = await probe(path)
            seen.append((f"{stage} {path}", status, body))

    async def main(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
        runner = current_runner()
        _, inbox = runner.root.open_inbox()
        await look("starting")
        task_status.started()
        await look("ready")
        runner.lifecycle.degrade("job store unreachable")
        await look("degraded")
        runner.lifecycle.recover()
        runner.request_shutdown("deploy")
        await look("withdrawn")
        status, body = await probe("/statusz")
        assert status == 200
        assert json.loads(body)["drain_delay_left"] == 5.0
        clock.jump(5)
        assert await inbox.receive() is STOP
        await look("shutting down")

    assert (
        trio_graceful.run(
            main, clock=clock, drain_delay=5, health_port=0, health_host="127.0.0.1"
        )
        == 0
    )
    assert seen == [
        ("starting /livez", 200, "live\n"),
        ("starting /readyz", 503, "not ready: starting\n"),
        ("ready /livez", 200, "live\n"),
        ("ready /readyz", 200, "ready\n"),
        ("degraded /livez", 200, "live\n"),
        ("degraded /readyz", 200, "ready: degraded (job store unreachable)\n"),
        ("withdrawn /livez", 200, "live\n"),
        (
            "withdrawn /readyz",
            503,
            "not ready: withdrawn: serving 5.0 s more, 1 task running\n",
        ),
        ("shutting down /livez", 200, "live\n"),
        (
            "shutting down /readyz",
            503,
            "not ready: shutting down: waiting for 1 task and 1 service, "
            "10.0 s of grace left\n",
        ),
    ]


def test_the_health_endpoint_stops_last_and_its_address_is_known(caplog):
    caplog.set_level(logging.INFO, logger="trio_graceful")
    addresses: list[tuple[str, int] | None] = []

    async def main() -> None:
        addresses.append(current_runner().health_address)
        await current_runner().start_service(cache)

    async def cache(inbox: trio_graceful.InboxReceiver[object], *, task_status):
        task_status.started()
        await inbox.receive()
        # the endpoint still answers while a later service stops
        status, _ = await probe("/livez")
        assert status == 200

    assert (
        trio_graceful.run(
            main, clock=still_clock(), health_port=0, health_host="127.0.0.1"
        )
        == 0
    )
    [(host, port)] = addresses
    assert host == "127.0.0.1"
    assert port > 0
    assert f"health endpoint on port {port}" in caplog.messages
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect((host, port))  # closed once the program ended


def test_a_port_in_use_fails_the_startup_and_main_never_runs(caplog):
    ran: list[str] = []

    async def main() -> None:
        ran.append("main")

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status = trio_graceful.run(
            main,
            clock=trio.testing.MockClock(autojump_threshold=0),
            health_port=port,
            health_host="127.0.0.1",
        )
    assert status == ExitCodes().startup_failed
    assert ran == []
    assert (
        f"startup failed: [Errno 98] the health endpoint cannot listen on port "
        f"{port} of 127.0.0.1: Address already in use"
    ) in caplog.messages


# -- systemd ---------------------------------------------------------------------------


@pytest.fixture
def manager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A service manager's notification socket, named in ``$NOTIFY_SOCKET``."""
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.setblocking(False)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        yield sock


def received(sock: socket.socket) -> list[str]:
    messages: list[str] = []
    while True:
        try:
            messages.append(sock.recv(4096).decode())
        except BlockingIOError:
            return messages


def test_systemd_hears_ready_stopping_and_the_drains_progress(manager):
    timeline: list[tuple[float, list[str]]] = []

    async def main() -> None:
        runner = current_runner()
        _, inbox = runner.root.open_inbox()
        await trio.sleep(1)
        timeline.append((trio.current_time(), received(manager)))
        runner.request_shutdown("deploy")
        assert await inbox.receive() is STOP
        await trio.sleep(2.25)  # cleaning up, off the progress ticks

    clock = trio.testing.MockClock(autojump_threshold=0)
    assert trio_graceful.run(main, clock=clock, drain_delay=1.5, grace=10) == 0
    assert timeline == [
        (1, ["STATUS=starting", "READY=1\nSTATUS=ready (main is ready)"])
    ]
    # The variable is not passed on to the processes the program starts.
    assert "NOTIFY_SOCKET" not in os.environ
    assert received(manager) == [
        "STOPPING=1\nSTATUS=withdrawn: serving 1.5 s more, 1 task running",
        # every second while leaving: the time left up to the watchdog's bound
        "EXTEND_TIMEOUT_USEC=14500000\n"
        "STATUS=withdrawn: serving 1.5 s more, 1 task running",
        "EXTEND_TIMEOUT_USEC=13500000\n"
        "STATUS=withdrawn: serving 0.5 s more, 1 task running",
        "STATUS=shutting down: waiting for 1 task and 0 services, 10.0 s of grace left",
        "EXTEND_TIMEOUT_USEC=12500000\n"
        "STATUS=shutting down: waiting for 1 task and 0 services, "
        "9.5 s of grace left",
        "EXTEND_TIMEOUT_USEC=11500000\n"
        "STATUS=shutting down: waiting for 1 task and 0 services, "
        "8.5 s of grace left",
    ]


@pytest.mark.parametrize(
    ("usec", "run_for", "keep_alives", "warnings"),
    [
        ("2000000", 3.5, 4, []),  # at 0, 1, 2, 3
        # at 0, 0.1, ..., 0.4 (the manager's queue is short): not a busy loop
        ("1", 0.45, 5, ["WATCHDOG_USEC='1' asks for a keep-alive every 5e-07 s"]),
    ],
)
def test_systemd_gets_keep_alives_at_half_its_interval_or_the_floor(
    manager, monkeypatch, caplog, usec, run_for, keep_alives, warnings
):
    monkeypatch.setenv("WATCHDOG_USEC", usec)

    async def main() -> None:
        await trio.sleep(run_for)

    clock = trio.testing.MockClock(autojump_threshold=0)
    assert trio_graceful.run(main, clock=clock) == 0
    assert [m for m in received(manager) if m == "WATCHDOG=1"] == [
        "WATCHDOG=1"
    ] * keep_alives
    logged = [
        r.getMessage().partition(";")[0]
        for r in caplog.records
        if r.name == "trio_graceful.sdnotify"
    ]
    assert logged == warnings


def test_health_max_connections_caps_the_endpoint_and_probes_get_in():
    async def main() -> None:
        address = current_runner().health_address
        assert address is not None
        idle = await trio.open_tcp_stream(*address)
        async with idle:
            # The probe takes the idle connection's one slot.
            assert await probe("/livez") == (200, "live\n")
            assert await idle.receive_some() == b""

    assert (
        trio_graceful.run(
            main,
            clock=still_clock(),
            health_port=0,
            health_host="127.0.0.1",
            health_max_connections=1,
        )
        == 0
    )


def test_a_notify_socket_that_does_not_exist_is_a_warning(
    tmp_path, monkeypatch, caplog
):
    missing = str(tmp_path / "nothing-here")
    monkeypatch.setenv("NOTIFY_SOCKET", missing)

    async def main() -> None:
        current_runner().request_shutdown()

    clock = trio.testing.MockClock(autojump_threshold=0)
    assert trio_graceful.run(main, clock=clock, drain_delay=1) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(repr(missing) in message for message in warnings), warnings
