"""Essay example 2: the infinite loop. Hard-cancelled exactly at the grace.

The worker pings its peer forever and knows nothing about shutdown. The
parent does not have to care: ``bundle.cancel(grace=10)`` at 60 s lets it run
for the whole grace and hard-cancels it at exactly 70 s.

Run it (virtual clock)::

    python examples/essay_2_infinite_loop.py

Try: a grace of 0 (the plain hard cancel of every structured-concurrency
library) and see the worker stop at 60 s.
"""

from __future__ import annotations

import trio
from essay_support import MessageSocket, Timeline, describe, run_virtual, socket_pair

import trio_graceful


async def worker(sock: MessageSocket, log: Timeline) -> None:
    try:
        while True:
            await sock.send("Hello, world!")
            await sock.receive()
    except trio.Cancelled:
        log("worker", "hard-cancelled")
        raise


async def echo_peer(sock: MessageSocket) -> None:
    while True:
        message = await sock.receive()
        await trio.sleep(1)
        await sock.send(message)


async def main(grace: float = 10) -> Timeline:
    log = Timeline()
    server_sock, client_sock = socket_pair()
    async with trio.open_nursery() as network:
        network.start_soon(echo_peer, client_sock)
        async with trio_graceful.open_bundle(name="main") as bundle:
            bundle.start_soon(worker, server_sock, log, name="worker")
            await trio.sleep(60)
            log("main", f"cancel(grace={grace})")
            report = await bundle.cancel(grace=grace)
            log("main", f"cancel returned ({describe(report)})")
        network.cancel_scope.cancel()
    return log


if __name__ == "__main__":
    run_virtual(main)
