"""Reloads of two worker processes under keep-alive traffic: what each server loses.

The same Starlette app (``bench/asgi_app.py``) served by two worker processes
under each server, each started as an operator would:

* ``python -m trio_graceful.asgi asgi_app:app --workers 2 --grace 5``;
* ``uvicorn asgi_app:app --workers 2 --timeout-graceful-shutdown 5``;
* ``hypercorn --worker-class trio --workers 2 --graceful-timeout 5 asgi_app:app``.

N keep-alive clients (raw HTTP/1.1 on Trio, in this process; every fourth
one pipelines 2 or 3 requests at once) send ``GET /work`` of 20 to 200 ms,
each reconnecting when its connection closes. The server gets SIGHUP every
3 s, five times, then serves 3 s more and gets SIGTERM. Counted: requests
the server had *received* (TCP-exact, see ``_asgi_clients``) and never
answered (*dropped*), connections refused and reset, answers other than 200,
and requests sent as the server's FIN came (a client may send them again).
For trio_graceful, each reload's duration comes from its log.

Run ``python bench/bench_workers_reload.py [--quick] [--clients 40,200]
[--servers trio_graceful,uvicorn,hypercorn]``; it prints one line per run.
``--quick`` is 8 clients, two reloads, trio_graceful only.
"""

from __future__ import annotations

import argparse
import itertools
import random
import re
import signal
import socket
import subprocess
import sys

import trio
from _asgi_clients import BENCH, ClientConnection, Stale
from _rolling import running

GRACE = 5.0
WORK_MS = (20, 200)
PIPELINE = (2, 3)
RELOAD_EVERY = 3.0
TIMEOUT = 180.0  # a bound against hangs, far above any expected time

COMMANDS = {
    "trio_graceful": (
        *("-m", "trio_graceful.asgi", "asgi_app:app", "--bind", "127.0.0.1:{port}"),
        *("--workers", "2", "--grace", f"{GRACE:g}"),
    ),
    "uvicorn": (
        *("-m", "uvicorn", "asgi_app:app", "--host", "127.0.0.1", "--port", "{port}"),
        *("--workers", "2", "--timeout-graceful-shutdown", f"{GRACE:g}"),
        "--no-access-log",
    ),
    "hypercorn": (
        *("-m", "hypercorn", "--worker-class", "trio", "--workers", "2"),
        *("--bind", "127.0.0.1:{port}", "--graceful-timeout", f"{GRACE:g}"),
        "asgi_app:app",
    ),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_serving(port: int) -> None:
    """Poll until the server answers a request (this is a benchmark, not a test)."""
    while True:
        try:
            connection = await ClientConnection.open(port)
        except OSError:
            await trio.sleep(0.1)
            continue
        try:
            await connection.send([(0, 0)])
            answer = await connection.receive()
        except Stale:
            answer = None
        await connection.aclose()
        if answer is not None and answer.status == 200:
            return
        await trio.sleep(0.1)


class Books:
    def __init__(self) -> None:
        self.counts = dict.fromkeys(
            ("sent", "answered", "dropped", "refused", "reset", "not_200", "after_fin"),
            0,
        )
        self.stopping = trio.Event()

    async def client(self, index: int, port: int) -> None:
        rng = random.Random(index)
        ids = itertools.count(1)
        while not self.stopping.is_set():
            try:
                connection = await ClientConnection.open(port)
            except OSError:
                self.counts["refused"] += 1
                await trio.sleep(0.05)
                continue
            await self._converse(connection, index % 4 == 3, rng, ids)
            await connection.aclose()
            counts = self.counts
            counts["sent"] += connection.sent
            counts["answered"] += len(connection.answers)
            counts["dropped"] += connection.dropped
            counts["after_fin"] += connection.sent_after_fin
            counts["reset"] += connection.ended == "reset"
            counts["not_200"] += sum(a.status != 200 for a in connection.answers)

    async def _converse(
        self,
        connection: ClientConnection,
        pipelining: bool,
        rng: random.Random,
        ids: itertools.count[int],
    ) -> None:
        while not self.stopping.is_set():
            size = rng.randint(*PIPELINE) if pipelining else 1
            batch = [(next(ids), rng.randint(*WORK_MS)) for _ in range(size)]
            try:
                await connection.send(batch)
            except Stale:
                return
            while connection.outstanding:
                answer = await connection.receive()
                if answer is None:
                    return
                if answer.close:
                    await connection.wait_closed()
                    return


async def measure(kind: str, clients: int, reloads: int) -> dict[str, object]:
    port = free_port()
    command = [sys.executable, *(part.format(port=port) for part in COMMANDS[kind])]
    books = Books()
    with trio.fail_after(TIMEOUT):
        async with running(
            kind,
            command,
            cwd=BENCH,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        ) as server:
            await wait_serving(port)
            async with trio.open_nursery() as nursery:
                for index in range(clients):
                    nursery.start_soon(books.client, index, port)
                for _ in range(reloads):
                    await trio.sleep(RELOAD_EVERY)
                    server.process.send_signal(signal.SIGHUP)
                await trio.sleep(RELOAD_EVERY)
                books.stopping.set()
            server.process.send_signal(signal.SIGTERM)
            status = await server.process.wait()
            lines = list(server.lines)
    return {
        "server": kind,
        "clients": clients,
        **books.counts,
        "exit": status,
        "reload_s": reload_durations(lines),
    }


def reload_durations(lines: list[str]) -> list[float]:
    """Each trio_graceful reload's duration, from its log's times."""
    begins: dict[str, float] = {}
    durations: list[float] = []
    for line in lines:
        match = re.match(
            r"\S+ (\d+):(\d+):([\d.,]+) .*reload (\d+) (started|done)", line
        )
        if match is None:
            continue
        hours, minutes, seconds, number, what = match.groups()
        at = int(hours) * 3600 + int(minutes) * 60 + float(seconds.replace(",", "."))
        if what == "started":
            begins[number] = at
        else:
            durations.append(round(at - begins[number], 2))
    return durations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--clients", default="40,200")
    parser.add_argument("--servers", default="trio_graceful,uvicorn,hypercorn")
    args = parser.parse_args()
    clients = [8] if args.quick else [int(n) for n in args.clients.split(",")]
    servers = ["trio_graceful"] if args.quick else args.servers.split(",")
    reloads = 2 if args.quick else 5
    for count in clients:
        for kind in servers:
            print(trio.run(measure, kind, count, reloads), flush=True)


if __name__ == "__main__":
    main()
