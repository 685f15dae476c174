"""Essay example 1: the trivial worker. The parent returns as soon as it ends.

The worker sends a greeting, waits for one reply and returns. It knows
nothing about graceful shutdown. After 60 s the parent calls
``bundle.cancel(grace=10)``: if the worker is done by then, or finishes
within the grace, ``cancel`` returns the moment it finishes; if the peer never
answers, the worker is hard-cancelled at 70 s.

Run it (on a virtual clock, so it takes milliseconds)::

    python examples/essay_1_trivial_worker.py

Try: change ``REPLY_AFTER`` to 30 (the worker is long gone at 60 s) or to
``None`` (the peer never answers; hard cancel at 70 s).
"""

from __future__ import annotations

import math

import trio
from essay_support import MessageSocket, Timeline, describe, run_virtual, socket_pair

import trio_graceful

REPLY_AFTER: float | None = 65.0  # when the peer answers; None: never


async def worker(sock: MessageSocket, log: Timeline) -> None:
    await sock.send("Hello, world!")
    reply = await sock.receive()
    log("worker", f"got {reply!r}, done")


async def peer(sock: MessageSocket, reply_after: float | None) -> None:
    await sock.receive()
    await trio.sleep(math.inf if reply_after is None else reply_after)
    await sock.send("Hello back")


async def main(reply_after: float | None = REPLY_AFTER) -> Timeline:
    log = Timeline()
    server_sock, client_sock = socket_pair()
    async with trio.open_nursery() as network:
        network.start_soon(peer, client_sock, reply_after)
        async with trio_graceful.open_bundle(name="main") as bundle:
            bundle.start_soon(worker, server_sock, log, name="worker")
            await trio.sleep(60)
            log("main", "cancel(grace=10)")
            report = await bundle.cancel(grace=10)
            log("main", f"cancel returned ({describe(report)})")
        network.cancel_scope.cancel()
    return log


if __name__ == "__main__":
    run_virtual(main)
