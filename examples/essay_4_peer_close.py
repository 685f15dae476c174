"""Essay example 4: peer-initiated close, the WebSocket way.

The worker answers messages until its peer sends CLOSE; then it answers with
a CLOSE of its own and returns. No STOP is involved: the request to shut down
comes from the network. Meanwhile the parent, at 60 s, gives whatever is
still running 10 s (``cancel(grace=10)``).

Run it (virtual clock)::

    python examples/essay_4_peer_close.py

Try: ``main(peer_closes_at=65)``: the peer closes during the grace and
``cancel`` returns right then.
"""

from __future__ import annotations

import trio
from essay_support import MessageSocket, Timeline, describe, run_virtual, socket_pair

import trio_graceful


async def worker(sock: MessageSocket, log: Timeline) -> None:
    while True:
        message = await sock.receive()
        if message == "CLOSE":
            log("worker", "peer sent CLOSE; answering CLOSE")
            await sock.send("CLOSE")
            return
        await sock.send("Hello, world!")


async def peer(sock: MessageSocket, closes_at: float, log: Timeline) -> None:
    await trio.sleep(closes_at)
    await sock.send("CLOSE")
    reply = await sock.receive()
    log("peer", f"got {reply!r}")


async def main(peer_closes_at: float = 30) -> Timeline:
    log = Timeline()
    server_sock, client_sock = socket_pair()
    async with trio.open_nursery() as network:
        network.start_soon(peer, client_sock, peer_closes_at, log)
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
