"""The WebSocket CLOSE example server as a real process, stopped by real signals.

Clients on two independent implementations, trio-websocket (in this Trio run)
and the `websockets` library (asyncio, in a thread with its own event loop),
talk to ``examples/websocket_close_server.py`` over loopback. The server logs
every request it takes (``--log-level DEBUG``), so the tests know exactly
what it received. Each test runs several rounds at once, each with its own
server process, to show that the outcome does not depend on timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import itertools
import random
import re
import resource
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator

import attrs
import pytest
import trio
import wsproto.events

from tests.support.examples import EXAMPLES
from tests.support.processes import ProcessLog, open_logged_process, refused
from tests.support.websocket_clients import (
    ClientRecord,
    WireClient,
    open_wire_client,
    pipelining_client,
    websockets_clients,
)

pytestmark = pytest.mark.realtime

EXAMPLE = EXAMPLES / "websocket_close_server.py"
SHUTTING_DOWN = (1001, "the server is shutting down")
RECEIVED = r": received request (\d+) "
TIMEOUT = 120  # generous: a bound against hangs, not a measurement
# Rounds per test: each with a server process of its own, run side by side,
# enough to show that the outcome does not depend on timing.
ROUNDS = 6
SUMMARY = (
    r"shutdown: (\d+) connections closed gracefully, (\d+) hard-closed; "
    r"requests read: (\d+) = (\d+) answered \+ (\d+) refused \+ (\d+) lost; "
    r"done in [0-9.]+ s$"
)


@attrs.define(eq=False)
class ServerProcess(ProcessLog):
    """A running example server and its log, read line by line."""

    @property
    def url(self) -> str:
        assert self.ready is not None
        return self.ready.group(1)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1].rstrip("/"))

    def received(self) -> set[int]:
        """The ids of the requests the server has logged as received."""
        return {
            int(m.group(1)) for line in self.lines if (m := re.search(RECEIVED, line))
        }


@contextlib.asynccontextmanager
async def server_process(
    *args: str, log_level: str = "DEBUG"
) -> AsyncIterator[ServerProcess]:
    command = [sys.executable, str(EXAMPLE), "--port", "0", "--log-level", log_level]
    listening = r"listening on (ws://\S+)"
    async with open_logged_process(
        [*command, *args], ServerProcess, ready=listening
    ) as server:
        yield server


def pipelined(base: int, count: int, rng: random.Random) -> list[tuple[int, int]]:
    return [(base + n, rng.randint(800, 1500)) for n in range(count)]


def endless(base: int, rng: random.Random) -> Iterator[tuple[int, int]]:
    for n in itertools.count():
        yield base + n, rng.randint(20, 300)


def logged_at(line: str) -> float:
    """The time a log line was written, as `time.time` gives it."""
    stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


# What these tests check is that a drain completes gracefully; a starved
# machine must not make the default grace (10 s) run out first.
AMPLE_GRACE = ("--grace", "60")

SLACK = 0.25
"""Seconds a busy server may take from finding nothing left to read to
logging the CLOSE it sends."""


def close_sent_at(server: ServerProcess, port: int) -> float:
    """When the server logged that it sends CLOSE to the client on ``port``."""
    [line] = [line for line in server.lines if f":{port}>: sending CLOSE" in line]
    return logged_at(line)


def summary(server: ServerProcess) -> tuple[int, ...]:
    """The numbers of the server's last log line, the summary of its shutdown."""
    match = re.search(SUMMARY, server.lines[-1])
    assert match, server.log()
    return tuple(map(int, match.groups()))


async def run_rounds(round_fn, count: int) -> None:
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            for index in range(count):
                nursery.start_soon(round_fn, index)


async def both_kinds_of_client(
    server: ServerProcess,
    plans: list,
    *,
    every: float | None = None,
) -> list[ClientRecord]:
    """Run the first half of ``plans`` on trio-websocket, the rest on websockets."""
    half = len(plans) // 2
    results: list[ClientRecord] = []

    async def on_trio(plan) -> None:
        record = ClientRecord()
        pause = None if every is None else (every, every)
        await pipelining_client(server.port, plan, record, pause=pause)
        results.append(record)

    async def on_asyncio() -> None:
        run = functools.partial(
            websockets_clients, server.url, plans[half:], every=every
        )
        results.extend(await trio.to_thread.run_sync(run))

    async with trio.open_nursery() as nursery:
        for plan in plans[:half]:
            nursery.start_soon(on_trio, plan)
        nursery.start_soon(on_asyncio)
    return results


def results_by_plan(plans, results: list[ClientRecord]) -> list[ClientRecord]:
    """Order the results like the plans (clients finish in any order)."""
    by_first_id = {min(result.sent): result for result in results}
    return [by_first_id[plan[0][0]] for plan in plans]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_signal_drains_every_received_request_then_closes_1001(signum):
    async def one_round(index: int) -> None:
        rng = random.Random(index)
        plans = [pipelined(1000 * client, 4, rng) for client in range(1, 5)]
        async with (
            server_process(*AMPLE_GRACE) as server,
            trio.open_nursery() as nursery,
        ):
            results: list[ClientRecord] = []

            async def clients() -> None:
                results.extend(await both_kinds_of_client(server, plans))

            nursery.start_soon(clients)
            await server.wait_for(RECEIVED, count=16)
            server.process.send_signal(signum)
            await server.wait_for("stopped accepting")
            # New connections are refused while the open ones still drain.
            assert await refused(server.port)
            assert server.process.returncode is None
            status = await server.exit_status()
        assert status == 0, server.log()
        for plan, result in zip(plans, results_by_plan(plans, results), strict=True):
            assert sorted(result.answered) == [request_id for request_id, _ in plan]
            assert (result.close_code, result.close_reason) == SHUTTING_DOWN
            assert result.clean
        assert summary(server) == (4, 0, 16, 16, 0, 0)

    await run_rounds(one_round, ROUNDS)  # per signal: 20 in all


@pytest.mark.parametrize("reject", [False, True])
async def test_signal_amid_continuous_requests_loses_nothing_read(reject):
    async def one_round(index: int) -> None:
        rng = random.Random(index)
        plans = [
            endless(1_000_000 * client, random.Random(rng.random()))
            for client in range(1, 5)
        ]
        signum = (signal.SIGTERM, signal.SIGINT)[index % 2]
        options = [*AMPLE_GRACE, *(["--reject-during-drain"] if reject else [])]
        async with (
            server_process(*options) as server,
            trio.open_nursery() as nursery,
        ):
            results: list[ClientRecord] = []

            async def clients() -> None:
                results.extend(await both_kinds_of_client(server, plans, every=0.01))

            nursery.start_soon(clients)
            await server.wait_for(RECEIVED, count=rng.randint(50, 150))
            server.process.send_signal(signum)
            status = await server.exit_status()
        assert status == 0, server.log()
        replied = [
            request_id for r in results for request_id in (*r.answered, *r.refused)
        ]
        assert len(replied) == len(set(replied))
        # Every request the server read got a reply, and only those.
        assert set(replied) == server.received()
        for result in results:
            # ... and every request sent well before the CLOSE was read. A
            # busy client sees the CLOSE late: the server's log says when it
            # went out; and a busy server logs it a while after it found
            # nothing left to read: SLACK allows for that.
            close = close_sent_at(server, result.local_port)
            assert result.unanswered(close - SLACK) == []
            assert (result.close_code, result.close_reason) == SHUTTING_DOWN
            assert result.clean
            assert set(result.answered) <= set(result.sent)
        graceful, hard, read, answered, refused, lost = summary(server)
        assert (graceful, hard, lost) == (4, 0, 0)
        assert read == answered + refused == len(replied)
        if reject:
            assert refused > 0  # the clients kept sending through the drain

    await run_rounds(one_round, ROUNDS)


# A graceful drain of requests of 60 s of work would take the request grace
# (20 s by default); an exit "at once" takes a small part of it, even on a
# busy machine. How fast it is belongs in a benchmark.
LONG_DRAIN = ("--grace", "60")
AT_ONCE = 10.0

SIGNAL_PAIRS = [
    (signal.SIGTERM, signal.SIGTERM),
    (signal.SIGINT, signal.SIGINT),
    (signal.SIGTERM, signal.SIGINT),
    (signal.SIGINT, signal.SIGTERM),
]


async def exit_after_second_signal(
    server: ServerProcess, first: signal.Signals, second: signal.Signals
) -> float:
    """Send both signals; return the seconds from the second to the exit."""
    server.process.send_signal(first)
    await server.wait_for("stopped accepting")
    t0 = trio.current_time()
    server.process.send_signal(second)
    status = await server.process.wait()
    elapsed = trio.current_time() - t0
    # a forced shutdown exits with 128 + the signal that started it
    assert status == 128 + first
    await server.wait_for(f"exiting at once: {second.name} again")
    assert not any("shutdown complete" in line for line in server.lines)
    return elapsed


async def test_second_signal_ends_the_process_at_once():
    # The rounds get ready side by side; once all are, the second signals go
    # one at a time, so that no round's exit is timed while other processes
    # start or stop. The clients are passive sockets: nothing else runs here
    # while an exit is timed.
    rounds = 2 * ROUNDS
    ready: list[int] = []
    all_ready = trio.Event()
    turn = trio.Lock()

    async def one_round(index: int) -> None:
        first, second = SIGNAL_PAIRS[index % len(SIGNAL_PAIRS)]
        async with (
            server_process(*LONG_DRAIN) as server,
            open_wire_client(server.port) as one,
            open_wire_client(server.port) as two,
        ):
            await one.send_request(1, 60_000)
            await two.send_request(2, 60_000)
            await server.wait_for(RECEIVED, count=2)
            ready.append(index)
            if len(ready) == rounds:
                all_ready.set()
            await all_ready.wait()
            async with turn:
                elapsed = await exit_after_second_signal(server, first, second)
            # Closed without an answer and without a CLOSE.
            await one.receive_eof()
            await two.receive_eof()
        assert elapsed < AT_ONCE

    await run_rounds(one_round, rounds)


def raise_open_file_limit(needed: int) -> None:
    """Raise this process's soft limit of open files (its children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"needs {needed} open files; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


async def test_second_signal_ends_the_process_at_once_with_1000_connections():
    connections = 1000
    raise_open_file_limit(connections + 256)
    with trio.fail_after(TIMEOUT):
        async with (
            server_process(*LONG_DRAIN) as server,
            contextlib.AsyncExitStack() as stack,
        ):
            clients = [
                await stack.enter_async_context(open_wire_client(server.port))
                for _ in range(connections)
            ]
            for request_id, client in enumerate(clients):
                await client.send_request(request_id, 60_000)
            await server.wait_for(RECEIVED, count=connections)
            elapsed = await exit_after_second_signal(
                server, signal.SIGTERM, signal.SIGINT
            )
            for client in clients:
                await client.receive_eof()
    assert elapsed < AT_ONCE


async def test_grace_hard_closes_a_client_that_never_answers_close():
    async def one_round(index: int) -> None:
        async with (
            server_process("--grace", "1") as server,
            open_wire_client(server.port) as silent,
            trio.open_nursery() as nursery,
        ):
            results: list[ClientRecord] = []

            async def polite() -> None:
                results.extend(await both_kinds_of_client(server, [[], []]))

            nursery.start_soon(polite)
            await silent.send_request(1, 0)
            assert await silent.receive() == wsproto.events.TextMessage('{"id": 1}')
            await server.wait_for(": connected$", count=3)
            t0 = trio.current_time()  # the grace starts after the signal
            server.process.send_signal(signal.SIGTERM)
            assert await silent.receive_close() == SHUTTING_DOWN
            await silent.receive_eof()
            elapsed = trio.current_time() - t0
            status = await server.exit_status()
        assert 1 <= elapsed < TIMEOUT / 6
        assert status == 0
        for result in results:
            assert (result.close_code, result.close_reason) == SHUTTING_DOWN
            assert result.clean
        assert summary(server) == (2, 1, 1, 1, 0, 0)

    await run_rounds(one_round, ROUNDS)


async def test_demo_runs_and_reports_both_shutdowns():
    command = [sys.executable, str(EXAMPLE), "--demo", "--clients", "10"]
    with trio.fail_after(TIMEOUT):
        result = await trio.run_process(
            command, capture_stdout=True, capture_stderr=True
        )
    lines = result.stdout.decode().splitlines()
    assert lines[0] == "demo: 10 clients per server, shutdown after 3 s (grace 10 s)"
    assert lines[1].split() == ["graceful", "shutdown", "cancel", "the", "nursery"]
    rows = {
        line.rsplit(None, 2)[0].strip(): line.rsplit(None, 2)[1:] for line in lines[2:9]
    }
    sent, answered, refused, wire, lost = (
        [int(n) for n in rows[name]]
        for name in [
            "requests sent",
            "answered",
            'refused: got {"error": "shutting down"}, may retry elsewhere',
            "no reply, sent < 20 ms before the connection ended (crossed the CLOSE)",
            "LOST: sent earlier, no reply ever came",
        ]
    )
    for column in range(2):  # every request counted once
        total = answered[column] + refused[column] + wire[column] + lost[column]
        assert sent[column] == total
    # The clients tell "lost" from "crossed the CLOSE" by when they sent a
    # request, which a client starved of CPU can get wrong; that the
    # graceful server lost none is its own exact count, in its log line
    # below. The naive shutdown loses what was in flight, long in work.
    assert lost[1] > 0
    assert lines[7].split()[-3:] == ["1001", "10x", "none"]
    assert lines[8].split()[-2:] == ["refused", "refused"]
    assert re.fullmatch(
        r"  graceful server's log: shutdown: 10 connections closed gracefully, "
        r"0 hard-closed; requests read: (\d+) = (\d+) answered \+ (\d+) refused "
        r"\+ 0 lost",
        lines[9],
    )
    assert len(lines) == 10


async def test_listeners_close_at_once_under_load():
    # 200 clients pipeline requests of no work as fast as they can. The
    # listeners close first thing, while all of them are still connected,
    # and no connection attempted after that is served.
    busy = 200
    raise_open_file_limit(busy + 100)
    records = [ClientRecord() for _ in range(busy)]
    served: list[float] = []  # when an attempt that was served began
    async with (
        server_process(log_level="INFO") as server,
        trio.open_nursery() as nursery,
    ):
        for index, record in enumerate(records):
            requests = ((index * 1_000_000 + n, 0) for n in itertools.count())
            nursery.start_soon(pipelining_client, server.port, requests, record)
        with trio.fail_after(TIMEOUT):
            # the records change under the clients: no event to wait for
            while not all(record.answered for record in records):  # noqa: ASYNC110
                await trio.sleep(0.05)
        server.process.send_signal(signal.SIGTERM)
        await trio.sleep(0.05)
        while server.process.returncode is None:
            attempted = time.time()
            if await handshake_answered(server.port):
                served.append(attempted)
            await trio.sleep(0.01)
        assert await server.exit_status() == 0
    # Counted from the server's own log, not from when this process sent
    # the signal (a busy machine may deliver it late, or run the server
    # late): the lines are stamped to the millisecond.
    [signalled] = [
        logged_at(line) for line in server.lines if "SIGTERM: shutting down" in line
    ]
    [(stopped, still_open)] = [
        (logged_at(line), int(m.group(1)))
        for line in server.lines
        if (m := re.search(r"stopped accepting; closing (\d+) connections", line))
    ]
    assert still_open >= busy  # before any connection was closed
    # A generous bound, against a server that keeps accepting for a while.
    assert stopped - signalled < 5
    # Attempted once the line was written (it may have been written up to
    # 1 ms after its stamp), and served all the same: none.
    served = [round(at - stopped, 3) for at in served if at - stopped >= 0.001]
    assert served == []
    assert all(record.close_code == 1001 for record in records)


async def handshake_answered(port: int) -> bool:
    """Try a new WebSocket connection; True if the server accepted it."""
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        return False
    async with stream:
        client = WireClient(stream)
        try:
            event = await client.handshake()
        except trio.BrokenResourceError:
            return False
        return isinstance(event, wsproto.events.AcceptConnection)


async def test_500_idle_connections_drain_with_the_full_handshake():
    connections = 500
    raise_open_file_limit(connections + 100)
    with trio.fail_after(TIMEOUT):
        async with (
            server_process("--grace", "5", log_level="INFO") as server,
            contextlib.AsyncExitStack() as stack,
        ):
            clients = [
                await stack.enter_async_context(open_wire_client(server.port))
                for _ in range(connections)
            ]
            server.process.send_signal(signal.SIGTERM)

            async def close(client: WireClient) -> None:
                assert await client.receive_close() == SHUTTING_DOWN
                await client.send_close(1001)
                await client.receive_eof()

            async with trio.open_nursery() as nursery:
                for client in clients:
                    nursery.start_soon(close, client)
            assert await server.exit_status() == 0
    # All within the grace: none was hard-closed.
    assert summary(server) == (connections, 0, 0, 0, 0, 0)


async def test_port_in_use_is_a_clear_error():
    async with trio.open_nursery():
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        command = [sys.executable, str(EXAMPLE), "--port", str(port)]
        with trio.fail_after(TIMEOUT):
            result = await trio.run_process(command, capture_stderr=True, check=False)
        for listener in listeners:
            await listener.aclose()
    assert result.returncode == 1
    assert (
        result.stderr.decode()
        .rstrip()
        .endswith(
            f"ERROR: cannot listen on 127.0.0.1 port {port}: "
            f"[Errno 98] Address already in use"
        )
    )


def echo_with_websockets(url: str) -> list[object]:
    """Echo text, binary and fragmented messages with the `websockets` client."""

    async def main() -> list[object]:
        from websockets.asyncio.client import connect

        seen: list[object] = []
        async with connect(url, ping_interval=None, max_size=2**24) as ws:
            for message in ["héllo", b"\x00\xff" * 40_000, "x" * 200_000]:
                await ws.send(message)
                seen.append(await ws.recv())
            await ws.send(["frag", "mented"])  # one message in two frames
            seen.append(await ws.recv())
            await ws.send([b"\x01", b"\x02"])
            seen.append(await ws.recv())
            await (await ws.ping(b"p"))  # the PONG comes back
        return seen

    return asyncio.run(main())


async def test_echo_mode_with_the_websockets_client_then_sigterm():
    async with server_process("--echo") as server:
        seen = await trio.to_thread.run_sync(echo_with_websockets, server.url)
        async with open_wire_client(server.port) as idle:
            server.process.send_signal(signal.SIGTERM)
            assert await idle.receive_close() == SHUTTING_DOWN
            await idle.send_close(1001)
            await idle.receive_eof()
        assert await server.exit_status() == 0
    assert seen == [
        "héllo",
        b"\x00\xff" * 40_000,
        "x" * 200_000,
        "fragmented",
        b"\x01\x02",
    ]
