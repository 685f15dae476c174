"""The clients of a simulated rolling restart, and what counts as a failed request.

`Fleet` speaks WebSocket to ``examples/websocket_close_server.py``; `HttpFleet`
speaks HTTP/1.1 to ``examples/asgi_service.py`` (see its docstring). For the
WebSocket fleet:

Each client is a ``websockets`` client (asyncio, all of them on one event loop
in a thread of their own) that pipelines requests of
``examples/websocket_close_server.py`` through the proxy, ``depth`` at a
time, and opens a new connection after ``per_connection`` requests (short
connections keep new connections coming, as many users do).

A request is *answered* once ``{"id": N}`` arrives. The client retries a
request only where the server's protocol says it was not processed:

* the answer ``{"id": N, "error": "shutting down"}`` (the server refused it;
  the client sends nothing more on that connection, and N on the next);
* no answer when the server's CLOSE 1001 arrives: the server answers every
  request it read before it sends CLOSE, and drops only what arrives after
  it (RFC 6455, section 1.4), so what is unanswered was never processed;
* a send that failed because the connection was already closing (nothing
  left the client).

A request *fails* when the client gives up on it:

* the connection could not be opened: the proxy sent it to a replica that
  refused it (kube-proxy forwards a connection once and does not retry); the
  request that was to go on it fails, as a browser's WebSocket reports an
  error to its page;
* the connection ended without the server's CLOSE (reset, or cut) while the
  request was in flight: it may have been processed, so retrying is unsafe;
* an answer that is neither (a protocol error) also fails its request.

Nothing else happens to a request: every one sent is answered, retried or
failed, and `ClientCounts.check` verifies that the books balance.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import random
import threading
import time
from collections.abc import Callable, Iterator

import _asgi_clients
import attrs
import trio
from _asgi_clients import Answer, Stale
from _rolling import Proxy
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

GOING_AWAY = 1001
RECONNECT_PAUSE = 0.05
"""Seconds a client waits after a connection failed, before the next one."""
OPEN_TIMEOUT = 30.0  # a bound against hangs on a busy machine


FAILURES = ("connect", "lost", "bad_answer")
"""Why a request failed: its connection could not be opened; it was in flight
when its connection ended without a CLOSE; the answer made no sense."""
RETRIES = ("refused", "after_close")
"""Why a request was sent again: answered "shutting down" (HTTP: 503);
unanswered at the server's CLOSE 1001 (HTTP: the server closed before it
received it)."""


@attrs.define
class ClientCounts:
    """What happened to the requests of every client (written by their thread)."""

    requests: int = 0
    """Requests the clients made (a retry is the same request)."""
    answered: int = 0
    connections: int = 0
    failed_by: collections.Counter[str] = attrs.field(factory=collections.Counter[str])
    """Failed requests by reason, one of `FAILURES`."""
    retried_by: collections.Counter[str] = attrs.field(factory=collections.Counter[str])
    """Requests sent again, by reason, one of `RETRIES`."""
    failures: list[tuple[float, str]] = attrs.field(factory=list[tuple[float, str]])
    """When each failure happened and why."""
    last_answer: dict[str, float] = attrs.field(factory=dict[str, float])
    """Replica -> when its last answer arrived."""
    duplicates: int = 0
    """Requests answered more than once: a retry that was not safe."""
    _done: set[int] = attrs.field(factory=set[int])

    @property
    def failed(self) -> int:
        return self.failed_by.total()

    def source(
        self, fresh: Iterator[int], queue: collections.deque[int]
    ) -> Callable[[], int]:
        """A client's next request: the first to send again, else a new one."""

        def next_request() -> int:
            if queue:
                return queue.popleft()
            self.requests += 1
            return next(fresh)

        return next_request

    def answer(self, request_id: int, replica: str) -> None:
        if request_id in self._done:
            self.duplicates += 1
        self._done.add(request_id)
        self.answered += 1
        self.last_answer[replica] = time.time()

    def fail(self, reason: str, why: str, count: int = 1) -> None:
        self.failed_by[reason] += count
        self.failures.extend([(time.time(), why)] * count)

    def check(self) -> None:
        """Raise if a request was answered twice, or is neither answered nor failed."""
        if self.duplicates or self.requests != self.answered + self.failed:
            raise RuntimeError(f"the books do not balance: {self.as_dict()}")

    def as_dict(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "answered": self.answered,
            "failed": self.failed,
            **{f"failed_{reason}": self.failed_by[reason] for reason in FAILURES},
            **{f"retried_{reason}": self.retried_by[reason] for reason in RETRIES},
            "duplicates": self.duplicates,
            "connections": self.connections,
        }


@attrs.define(eq=False)
class Fleet:
    """The clients, run by `run` in a thread; `stop` ends them from any thread."""

    url: str
    route_of: Callable[[int], str]
    """The replica the proxy sent a connection from this local port to."""
    clients: int
    depth: int
    per_connection: int
    work_ms: tuple[int, int]
    seed: int = 0
    counts: ClientCounts = attrs.field(factory=ClientCounts)
    warmed_up: threading.Event = attrs.field(factory=threading.Event)
    """Set once every client has had an answer."""
    _loop: asyncio.AbstractEventLoop | None = None
    _stopping: asyncio.Event | None = None

    def run(self) -> None:
        """Run the clients until `stop` (blocks: call it in a thread)."""
        # A plain loop of its own, whatever policy the process has set (a
        # process that imported trio_asyncio has that library's).
        loop = asyncio.SelectorEventLoop()
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def stop(self) -> None:
        """Ask every client to finish: no new request, answers awaited."""
        if self._loop is not None and not self._loop.is_closed():
            assert self._stopping is not None
            self._loop.call_soon_threadsafe(self._stopping.set)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        warm = [asyncio.Event() for _ in range(self.clients)]

        async def warmed() -> None:
            for event in warm:
                await event.wait()
            self.warmed_up.set()

        await asyncio.gather(
            warmed(), *(self._client(i, warm[i]) for i in range(self.clients))
        )

    async def _client(self, index: int, warm: asyncio.Event) -> None:
        assert self._stopping is not None
        rng = random.Random(self.seed * 1000 + index)
        queue: collections.deque[int] = collections.deque()  # to send again
        next_request = self.counts.source(itertools.count(index * 10**9), queue)

        # Requests waiting to be sent again are sent even after stop().
        while queue or not self._stopping.is_set():
            try:
                ws = await connect(
                    self.url,
                    ping_interval=None,
                    proxy=None,
                    open_timeout=OPEN_TIMEOUT,
                    compression=None,
                )
            # Refused, or closed during the opening handshake (how that
            # shows depends on the moment the proxy gave up on the replica).
            except (OSError, InvalidHandshake, ConnectionClosed, TimeoutError) as exc:
                self.counts.fail("connect", f"connection failed: {exc!r}")
                next_request()  # the request it was for is given up
                await asyncio.sleep(RECONNECT_PAUSE)
                continue
            self.counts.connections += 1
            replica = self.route_of(ws.local_address[1])
            await self._converse(ws, replica, next_request, queue, rng, warm)

    async def _converse(
        self,
        ws: ClientConnection,
        replica: str,
        next_request: Callable[[], int],
        queue: collections.deque[int],
        rng: random.Random,
        warm: asyncio.Event,
    ) -> None:
        """Pipeline requests on one connection until it ends; settle each one."""
        stopping = self._stopping
        assert stopping is not None
        in_flight: set[int] = set()
        changed = asyncio.Event()
        refused = False  # the server said it is shutting down: send no more

        async def send() -> None:
            for _ in range(self.per_connection):
                while len(in_flight) >= self.depth:
                    changed.clear()
                    await changed.wait()
                if refused or (stopping.is_set() and not queue):
                    break
                request_id = next_request()
                in_flight.add(request_id)
                message = {"id": request_id, "work_ms": rng.randint(*self.work_ms)}
                try:
                    await ws.send(json.dumps(message))
                except ConnectionClosed:  # closing already: it never left
                    in_flight.discard(request_id)
                    queue.appendleft(request_id)
                    return
            while in_flight:
                changed.clear()
                await changed.wait()
            await ws.close()

        sender = asyncio.create_task(send())
        try:
            async for message in ws:
                reply = json.loads(message)
                request_id = reply.get("id")
                if request_id not in in_flight:
                    self.counts.fail("bad_answer", f"unexpected {reply!r}")
                    continue
                in_flight.discard(request_id)
                changed.set()
                if reply.get("error") == "shutting down":
                    refused = True
                    self.counts.retried_by["refused"] += 1
                    queue.append(request_id)
                elif "error" in reply:
                    self.counts.fail("bad_answer", f"error answer {reply!r}")
                else:
                    self.counts.answer(request_id, replica)
                    warm.set()
        except ConnectionClosed:
            pass
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        if not in_flight:
            return
        close = ws.protocol.close_rcvd
        if close is not None and close.code == GOING_AWAY:
            self.counts.retried_by["after_close"] += len(in_flight)
            queue.extend(sorted(in_flight))
        else:
            why = f"connection to {replica} lost: {close!r}"
            self.counts.fail("lost", why, len(in_flight))


# -- HTTP/1.1 -----------------------------------------------------------------


@attrs.define(eq=False)
class HttpFleet:
    """HTTP/1.1 keep-alive clients of ``examples/asgi_service.py``, through the proxy.

    Each client (a Trio task of the orchestrator's run) pipelines ``depth``
    ``GET /work`` requests at a time on a keep-alive connection and opens a
    new one after ``per_connection`` requests, or when the server closed
    it. A request is *answered* by a 200. It is sent again when:

    * the answer is a 503 (``serve_asgi``'s answer to a request it cut off
      without running it);
    * it is unanswered when the connection ends, and the replica had not
      received it: the proxy counts the bytes the replica had received before
      it closed (`_rolling.splice`), so a request written as, or after, the
      replica closed an idle connection is known never to have been
      processed.

    It *fails* when the connection could not be opened (the proxy sent it to
    a replica that refused it: ``"connect"``), when the replica had received
    it and closed without answering (``"lost"``), or when the answer is
    neither (``"bad_answer"``). ``retried_after_close`` counts the requests
    sent again because the replica closed before it received them.
    """

    proxy: Proxy
    clients: int
    depth: int
    per_connection: int
    work_ms: tuple[int, int]
    seed: int = 0
    counts: ClientCounts = attrs.field(factory=ClientCounts)
    warmed_up: trio.Event = attrs.field(factory=trio.Event)
    """Set once every client has had an answer."""
    _stopping: trio.Event = attrs.field(factory=trio.Event)

    def stop(self) -> None:
        """Ask every client to finish: no new request, answers awaited."""
        self._stopping.set()

    async def run(self) -> None:
        """Run the clients until `stop`."""
        warm = [trio.Event() for _ in range(self.clients)]
        async with trio.open_nursery() as nursery:
            for index in range(self.clients):
                nursery.start_soon(self._client, index, warm[index])
            for event in warm:
                await event.wait()
            self.warmed_up.set()

    async def _client(self, index: int, warm: trio.Event) -> None:
        rng = random.Random(self.seed * 1000 + index)
        queue: collections.deque[int] = collections.deque()  # to send again
        # Ids of at most 9 digits, as the example accepts: one in every `clients`.
        next_request = self.counts.source(itertools.count(index, self.clients), queue)

        # Requests waiting to be sent again are sent even after stop().
        while queue or not self._stopping.is_set():
            connection = await _asgi_clients.ClientConnection.open(self.proxy.port)
            self.counts.connections += 1
            try:
                await self._converse(connection, next_request, queue, rng, warm)
            finally:
                await connection.aclose()
            if connection.ended:
                await trio.sleep(RECONNECT_PAUSE)

    async def _converse(
        self,
        connection: _asgi_clients.ClientConnection,
        next_request: Callable[[], int],
        queue: collections.deque[int],
        rng: random.Random,
        warm: trio.Event,
    ) -> None:
        """Send requests on one connection until it ends; settle each one."""
        port = connection.stream.socket.getsockname()[1]
        while connection.sent < self.per_connection:
            if self._stopping.is_set() and not queue:
                break
            ids = [next_request() for _ in range(self.depth)]
            try:
                await connection.send([(i, rng.randint(*self.work_ms)) for i in ids])
            except Stale:
                queue.extendleft(reversed(ids))
                break
            closing = False
            while connection.outstanding and not closing:
                answer = await connection.receive()
                if answer is None:
                    break
                closing = answer.close
                self._settle(answer, self.proxy.route_of(port), queue, warm)
            if closing or connection.ended:
                break
        self._settle_unanswered(connection, port, queue)

    def _settle(
        self,
        answer: Answer,
        replica: str,
        queue: collections.deque[int],
        warm: trio.Event,
    ) -> None:
        if answer.status == 200:
            self.counts.answer(answer.request_id, replica)
            warm.set()
        elif answer.status == 503:
            self.counts.retried_by["refused"] += 1
            queue.append(answer.request_id)
        else:
            self.counts.fail("bad_answer", f"status {answer.status}")

    def _settle_unanswered(
        self,
        connection: _asgi_clients.ClientConnection,
        port: int,
        queue: collections.deque[int],
    ) -> None:
        outstanding = list(connection.outstanding)
        connection.outstanding.clear()
        if not outstanding:
            return
        if port in self.proxy.refused or port not in self.proxy.routes:
            self.counts.fail("connect", "connection refused", len(outstanding))
            return
        replica = self.proxy.route_of(port)
        delivered = self.proxy.delivered[port]
        for sent in outstanding:
            if sent.end <= delivered:
                self.counts.fail("lost", f"{replica} closed without answering")
            else:
                self.counts.retried_by["after_close"] += 1
                queue.append(sent.request_id)
