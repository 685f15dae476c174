"""The WebSocket server's graceful shutdown next to a naive one, in one glance.

Two servers of ``examples/websocket_close_server.py`` run in this process,
each with the same clients: they pipeline requests with random work and keep
sending until the connection ends, as real clients do. After 3 seconds one
server shuts down gracefully (STOP, then a grace); the other the naive way,
by cancelling the nursery that runs it. The report counts every request
once, from the clients' side, and puts the two side by side::

    python examples/websocket_demo.py [--clients 20] [--reject-during-drain]

Try ``--grace 0.5`` to see the grace cut the drain short.
"""

from __future__ import annotations

import argparse
import functools
import random
import sys
from collections import Counter
from collections.abc import Sequence

import attrs
import trio
from websocket_clients import ClientRecord, pipelining_client, random_requests
from websocket_close_server import WorkServer

import trio_graceful

SHUTDOWN_AFTER = 3.0
"""Seconds into the demo at which both shutdowns begin."""
WORK_MS = (100, 1500)
PAUSE = (0.05, 0.4)


@attrs.frozen
class RunReport:
    """What the clients of one server saw, and what the server counted."""

    clients: list[ClientRecord]
    new_connection_during_drain: str
    server_summary: str

    def rows(self) -> list[int | str]:
        """The values of `ROWS`, in order."""
        codes = Counter(c.close_code for c in self.clients)
        return [
            sum(len(c.sent) for c in self.clients),
            sum(len(c.answered) for c in self.clients),
            sum(len(c.refused) for c in self.clients),
            sum(c.on_the_wire() for c in self.clients),
            sum(len(c.unanswered()) for c in self.clients),
            ", ".join(
                f"{n}x {'none' if code is None else code}"
                for code, n in sorted(codes.items(), key=lambda item: item[0] or 0)
            ),
            self.new_connection_during_drain,
        ]


ROWS = [
    "requests sent",
    "  answered",
    '  refused: got {"error": "shutting down"}, may retry elsewhere',
    "  no reply, sent < 20 ms before the connection ended (crossed the CLOSE)",
    "  LOST: sent earlier, no reply ever came",
    "the clients got CLOSE",
    "a new connection during the shutdown",
]


@attrs.frozen
class DemoReport:
    """Both runs; ``str()`` gives the printed table."""

    clients: int
    grace: float
    graceful: RunReport
    naive: RunReport

    def __str__(self) -> str:
        header = ["", "graceful shutdown", "cancel the nursery"]
        table = [header] + [
            [name, str(ours), str(theirs)]
            for name, ours, theirs in zip(
                ROWS, self.graceful.rows(), self.naive.rows(), strict=True
            )
        ]
        widths = [max(len(row[i]) for row in table) for i in range(3)]
        lines = [
            f"demo: {self.clients} clients per server, shutdown after "
            f"{SHUTDOWN_AFTER:g} s (grace {self.grace:g} s)"
        ]
        for row in table:
            lines.append(
                f"  {row[0].ljust(widths[0])}  {row[1].rjust(widths[1])}  "
                f"{row[2].rjust(widths[2])}".rstrip()
            )
        lines.append(f"  graceful server's log: {self.graceful.server_summary}")
        return "\n".join(lines)


async def _attempt_connection(port: int) -> str:
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        return "refused"
    await stream.aclose()
    return "accepted"


async def run_one(
    server: WorkServer, clients: int, seed: int, *, graceful: bool, grace: float
) -> RunReport:
    """Serve ``clients`` clients; after `SHUTDOWN_AFTER` s shut down one way."""
    records = [ClientRecord() for _ in range(clients)]
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    rng = random.Random(seed)
    attempt = ""
    async with trio.open_nursery() as nursery:
        async with trio_graceful.open_bundle(name="server") as bundle:
            _, inbox = bundle.open_inbox()
            await bundle.start(server.serve, inbox, listeners)
            for index, record in enumerate(records):
                client_rng = random.Random(rng.random())
                requests = random_requests(10_000 * index, client_rng, WORK_MS)
                client = functools.partial(
                    pipelining_client, pause=PAUSE, rng=client_rng
                )
                nursery.start_soon(client, port, requests, record)
            await trio.sleep(SHUTDOWN_AFTER)
            if graceful:

                async def attempt_during_drain() -> None:
                    nonlocal attempt
                    await server.wait_draining()
                    attempt = await _attempt_connection(port)

                nursery.start_soon(attempt_during_drain)
                await bundle.shutdown(grace=grace)
            else:
                bundle.cancel_scope.cancel()  # the naive way
        if not graceful:
            attempt = await _attempt_connection(port)
    return RunReport(records, attempt, server.statistics().summary())


async def run_demo(
    *,
    clients: int = 20,
    grace: float = 10.0,
    request_grace: float = 2.0,
    reject_during_drain: bool = False,
    seed: int = 1,
) -> DemoReport:
    """Run both servers side by side with the same clients; report."""
    runs: dict[bool, RunReport] = {}

    async def run(graceful: bool) -> None:
        server = WorkServer(
            request_grace=request_grace, reject_during_drain=reject_during_drain
        )
        runs[graceful] = await run_one(
            server, clients, seed, graceful=graceful, grace=grace
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, True)
        nursery.start_soon(run, False)
    return DemoReport(clients, grace, graceful=runs[True], naive=runs[False])


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo from the command line and print its report."""
    parser = argparse.ArgumentParser(
        description="A graceful WebSocket shutdown next to a naive one."
    )
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--grace", type=float, default=10.0)
    parser.add_argument(
        "--request-grace",
        type=float,
        default=2.0,
        help="seconds of work the requests get in the shutdown (default: 2)",
    )
    parser.add_argument("--reject-during-drain", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--demo", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.clients < 1:
        parser.error(f"argument --clients: clients must be >= 1, not {args.clients}")
    report = trio.run(
        functools.partial(
            run_demo,
            clients=args.clients,
            grace=args.grace,
            request_grace=args.request_grace,
            reject_during_drain=args.reject_during_drain,
            seed=args.seed,
        )
    )
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
