"""The drain's races over HTTP/1.1, each placed at its exact moment.

A drain under load meets three moments that a quiet test never shows: STOP
waking a connection whose reader has just taken pipelined requests from the
socket and not parsed them yet; connections that the kernel has accepted
but the server not yet, in the listener's queue when it closes; and a
client answered just before STOP, whose next request is on its way. In
exact virtual time, on a Unix socket (see tests/support/asgi_server.py).
"""

from __future__ import annotations

import logging
import re
import socket
from pathlib import Path

import pytest
import trio
import trio.testing
from hypercorn.config import Config

from tests.support.asgi_app import Log, make_app
from tests.support.asgi_server import RawClient, serving
from trio_graceful.asgi import _shutdown
from trio_graceful.asgi._connection import DRAIN_KEEP_ALIVE, Connection
from trio_graceful.asgi._listeners import Listener, backlog

QUEUED = r"STOP: (\d+) connections taken from the listeners' queues"


@pytest.fixture
def log() -> Log:
    return Log()


async def test_stop_between_a_read_and_its_parsing_loses_no_pipelined_request(
    tmp_path: Path,
    log: Log,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Under load, STOP's wake-up can reach a connection whose reader has
    # taken two pipelined requests from the socket but not run since: the
    # bytes are out of the socket, and not parsed yet. Here the reader holds
    # them until STOP has come, which puts the wake-up exactly there.
    receive = Connection._receive

    async def receive_across_stop(self: Connection) -> bytes:
        data = await receive(self)
        if data.count(b"GET ") == 2:
            with trio.CancelScope(shield=True):
                await self._state.drain.stopped.wait()
        return data

    monkeypatch.setattr(Connection, "_receive", receive_across_stop)
    async with serving(make_app(log), tmp_path) as served:
        client = await served.request("/work?s=2", "/work?s=1")
        async with served.stopping(10):
            answers = [await client.answer() for _ in range(2)]
            assert [(a.status, a.closes) for a in answers] == [
                (200, False),
                (200, True),
            ]
            assert trio.current_time() == 3  # one after the other
            assert await client.end() == "eof"
            await client.aclose()


def _connect_and_send(path: Path, target: str) -> socket.socket:
    """Connect and write a request without a checkpoint: the server runs not."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    sock.sendall(f"GET {target} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    return sock


async def test_connections_in_the_listeners_queue_at_stop_are_served(
    tmp_path: Path,
    log: Log,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Clients connect and write their requests as STOP comes, before the
    # listener closes: the kernel has accepted them, the server not yet.
    # Closing the listener with them in its queue would reset them.
    caplog.set_level(logging.INFO, logger="trio_graceful.asgi")
    count = 20
    socks: list[socket.socket] = []
    cutoff = _shutdown.cutoff

    def cutoff_as_clients_connect(deadline: float, now: float, reserve: float) -> float:
        assert served.path is not None
        socks.extend(_connect_and_send(served.path, "/work?s=1") for _ in range(count))
        return cutoff(deadline, now, reserve)

    monkeypatch.setattr(_shutdown, "cutoff", cutoff_as_clients_connect)
    async with serving(make_app(log), tmp_path) as served:
        async with served.stopping(10):
            await trio.testing.wait_all_tasks_blocked()
            for sock in socks:
                client = RawClient(
                    trio.SocketStream(trio.socket.from_stdlib_socket(sock))
                )
                answer = await client.answer()
                assert (answer.status, answer.closes) == (200, True)
                assert await client.end() == "eof"
                await client.aclose()
            assert trio.current_time() == 1
        assert served.server.statistics().connections_total == count
    [taken] = [
        int(found.group(1))
        for record in caplog.records
        if (found := re.fullmatch(QUEUED, record.getMessage()))
    ]
    assert taken == count


async def test_a_request_sent_just_after_stop_is_answered_with_close(
    tmp_path: Path, log: Log, autojump_clock: trio.testing.MockClock
) -> None:
    # The client read its answer (without Connection: close: STOP had not
    # come) and sends its next request as STOP comes: it is answered, and
    # that answer says close, rather than the connection closed under it.
    async with serving(make_app(log), tmp_path) as served:
        client = await served.connect()
        await client.send("/work?s=1")
        assert not (await client.answer()).closes
        async with served.stopping(10):
            await trio.sleep(DRAIN_KEEP_ALIVE / 2)
            await client.send("/work?s=1")
            answer = await client.answer()
            assert (answer.status, answer.closes) == (200, True)
            assert await client.end() == "eof"
            await client.aclose()


async def test_an_idle_connection_closes_at_its_drain_keep_alive(
    tmp_path: Path, log: Log, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(make_app(log), tmp_path) as served:
        client = await served.connect()
        await client.send("/work?s=1")
        await client.answer()
        answered = trio.current_time()
        await trio.sleep(DRAIN_KEEP_ALIVE / 4)
        async with served.stopping(10):
            assert await client.end() == "eof"
            # Counted from its last response, not from STOP.
            assert trio.current_time() == answered + DRAIN_KEEP_ALIVE
            await client.aclose()


async def test_an_idle_connection_is_not_held_into_the_cut_off(
    tmp_path: Path, log: Log, autojump_clock: trio.testing.MockClock
) -> None:
    # A grace of 1 s: the cut-off comes 0.9 s after STOP, before the drain's
    # keep-alive would end. A request then would be cut off: closed at once.
    async with serving(make_app(log), tmp_path) as served:
        client = await served.connect()
        await client.send("/work?s=1")
        await client.answer()
        answered = trio.current_time()
        async with served.stopping(1):
            assert await client.end() == "eof"
            assert trio.current_time() == answered
            await client.aclose()


async def test_a_connection_accepted_just_before_stop_gets_its_first_answer(
    tmp_path: Path, log: Log, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(make_app(log), tmp_path) as served:
        client = await served.connect()
        await trio.testing.wait_all_tasks_blocked()
        async with served.stopping(10):
            await trio.sleep(DRAIN_KEEP_ALIVE / 2)
            await client.send("/work")
            answer = await client.answer()
            assert (answer.status, answer.closes) == (200, True)
            assert await client.end() == "eof"
            await client.aclose()


def test_the_listeners_queue_is_the_systems_longest_unless_the_config_sets_one() -> (
    None
):
    # Hypercorn's default of 100 overflows in a burst of connections.
    assert backlog(Config()) == max(100, socket.SOMAXCONN)
    config = Config()
    config.backlog = 50
    assert backlog(config) == 50


async def test_a_closed_listener_has_no_queue(tmp_path: Path) -> None:
    # Closed at STOP just as its accept loop's last accept returned: the loop
    # goes on to the queue, finds none, and ends at its next accept.
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(tmp_path / "listening.sock"))
    sock.listen()
    listener = Listener(sock, None)
    listener.close()
    assert listener.accept_queued() == []
    with pytest.raises(trio.ClosedResourceError):
        await listener.accept()
