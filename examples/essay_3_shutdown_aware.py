"""Essay example 3: a shutdown-aware worker. STOP only at the idle point.

An RPC worker answers requests that take 3 s each. Its only graceful-shutdown
point is where it waits for the next request: ``inbox.until_stop(sock.receive)``
returns either the next request or `trio_graceful.STOP`. A request that is
being worked on when STOP arrives still gets its reply; then the worker does
its own shutdown work (flushing, 2 s) and returns.

The parent sends STOP with ``bundle.shutdown(grace=10)`` at 60 s, while the
request that came in at 59 s is in flight.

Run it (virtual clock)::

    python examples/essay_3_shutdown_aware.py

Try: make the flush take 20 s: the grace still ends everything at 70 s.
"""

from __future__ import annotations

import trio
from essay_support import MessageSocket, Timeline, describe, run_virtual, socket_pair

import trio_graceful
from trio_graceful import STOP

WORK = 3.0
FLUSH = 2.0


async def worker(
    sock: MessageSocket,
    inbox: trio_graceful.InboxReceiver[str],
    log: Timeline,
    flush: float,
) -> None:
    while True:
        request = await inbox.until_stop(sock.receive)
        if request is STOP:
            log("worker", "STOP at the idle point; flushing")
            await trio.sleep(flush)
            log("worker", "flushed, done")
            return
        log("worker", f"working on {request!r}")
        await trio.sleep(WORK)
        await sock.send(f"reply to {request}")


async def client(sock: MessageSocket, log: Timeline) -> None:
    await trio.sleep(59)
    await sock.send("request-1")
    log("client", "sent request-1")
    reply = await sock.receive()
    log("client", f"got {reply!r}")


async def main(flush: float = FLUSH) -> Timeline:
    log = Timeline()
    server_sock, client_sock = socket_pair()
    async with trio.open_nursery() as network:
        network.start_soon(client, client_sock, log)
        async with trio_graceful.open_bundle(name="main") as bundle:
            _, inbox = bundle.open_inbox()
            bundle.start_soon(worker, server_sock, inbox, log, flush, name="worker")
            await trio.sleep(60)
            log("main", "shutdown(grace=10)")
            report = await bundle.shutdown(grace=10)
            log("main", f"shutdown returned ({describe(report)})")
        network.cancel_scope.cancel()
    return log


if __name__ == "__main__":
    run_virtual(main)
