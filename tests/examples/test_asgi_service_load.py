"""examples/asgi_service.py under load: 200 keep-alive clients, SIGTERM mid-traffic.

Each client keeps a connection busy with ``GET /work`` (10 to 400 ms of
work), one request at a time or, every fourth client, two or three
pipelined, and opens a new connection whenever its connection closes, until
the server refuses it. After a second of traffic the service gets SIGTERM.

A request counts as *received* if the client's socket was still ESTABLISHED
right after it was written: on loopback the server's FIN reaches the client
within the server's own ``shutdown`` or ``close`` (bench/_asgi_clients.py
has the reasoning). A request written as the FIN came was never read, and a
client may send it again: it is not counted. Asserted: no received request
is left unanswered, no connection whose last response came after the signal
ends without ``Connection: close`` on it, no reset, and a graceful exit.
"""

from __future__ import annotations

import collections
import itertools
import random
import signal
import socket

import attrs
import h11
import pytest
import trio

from tests.support.asgi_process import encode_get, open_service
from tests.support.processes import PATIENCE

pytestmark = pytest.mark.realtime

CLIENTS = 200
TRAFFIC_S = 1.0
WORK_MS = (10, 400)
TCP_ESTABLISHED = 1


@attrs.define(eq=False)
class LoadConnection:
    """One keep-alive connection of a client, and its books."""

    stream: trio.SocketStream
    parser: h11.Connection = attrs.field(factory=lambda: h11.Connection(h11.CLIENT))
    waiting: collections.deque[bool] = attrs.field(factory=collections.deque[bool])
    """For each request not answered yet: whether the server had received it."""
    answers: list[tuple[float, bool]] = attrs.field(factory=list[tuple[float, bool]])
    """For each answer: `trio.current_time` then, and whether it said close."""
    ended: str = ""

    def established(self) -> bool:
        info = self.stream.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
        return info[0] == TCP_ESTABLISHED

    async def send(self, targets: list[str]) -> bool:
        """Write the requests at once; False if the server had closed before."""
        if not self.established():
            return False
        try:
            await self.stream.send_all(b"".join(encode_get(t) for t in targets))
        except trio.BrokenResourceError:
            received = False
        else:
            received = self.established()
        self.waiting.extend([received] * len(targets))
        return True

    async def answer(self) -> bool:
        """Read the next response; False once the connection has ended."""
        parser = self.parser
        if parser.our_state is h11.DONE:
            parser.start_next_cycle()
        parser.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
        parser.send(h11.EndOfMessage())
        close = False
        while True:
            event = parser.next_event()
            if event is h11.NEED_DATA:
                try:
                    data = await self.stream.receive_some()
                except trio.BrokenResourceError:
                    self.ended = "reset"
                    return False
                if not data:
                    self.ended = "eof"
                    return False
                parser.receive_data(data)
            elif isinstance(event, h11.Response):
                close = (b"connection", b"close") in event.headers
            elif isinstance(event, h11.EndOfMessage):
                self.waiting.popleft()
                self.answers.append((trio.current_time(), close))
                return True

    async def wait_closed(self) -> None:
        while not self.ended:
            try:
                data = await self.stream.receive_some()
            except trio.BrokenResourceError:
                self.ended = "reset"
            else:
                self.ended = "" if data else "eof"


async def keep_sending(
    index: int, port: int, connections: list[LoadConnection], signalled: trio.Event
) -> None:
    """One client: requests until its connection closes, then a new connection."""
    rng = random.Random(index)
    ids = itertools.count(index * 100_000)
    while True:
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
        except OSError:
            if signalled.is_set():
                return  # refused: the server has stopped listening
            await trio.sleep(0.05)
            continue
        connection = LoadConnection(stream)
        connections.append(connection)
        async with stream:
            while True:
                size = rng.randint(2, 3) if index % 4 == 3 else 1
                targets = [
                    f"/work?ms={rng.randint(*WORK_MS)}&id={next(ids)}"
                    for _ in range(size)
                ]
                if not await connection.send(targets):
                    break
                while connection.waiting:
                    if not await connection.answer():
                        break
                if connection.ended or connection.answers[-1][1]:
                    break
            await connection.wait_closed()


async def test_sigterm_under_load_drops_nothing_and_announces_every_close() -> None:
    connections: list[LoadConnection] = []
    signalled = trio.Event()
    with trio.fail_after(PATIENCE):
        async with (
            open_service("--grace", "5") as service,
            trio.open_nursery() as nursery,
        ):
            for index in range(CLIENTS):
                nursery.start_soon(
                    keep_sending, index, service.port, connections, signalled
                )
            await trio.sleep(TRAFFIC_S)
            signal_at = trio.current_time()
            service.process.send_signal(signal.SIGTERM)
            signalled.set()
            status = await service.exit_status()
    dropped = [c for c in connections if any(c.waiting)]
    unannounced = [
        c
        for c in connections
        if c.answers and c.answers[-1][0] >= signal_at and not c.answers[-1][1]
    ]
    reset = [c for c in connections if c.ended == "reset"]
    answered = sum(len(c.answers) for c in connections)
    assert answered > CLIENTS, answered  # it was under load
    assert (len(dropped), len(unannounced), len(reset)) == (0, 0, 0), [
        (c.answers, list(c.waiting), c.ended) for c in dropped + unannounced + reset
    ]
    service.check_graceful_exit(status)
