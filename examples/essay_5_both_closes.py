"""Essay example 5: server- and peer-initiated close in one worker.

The full WebSocket-style worker. At its idle point it waits for the next
message *or* STOP (``inbox.until_stop(sock.receive)``):

* a message ``CLOSE`` from the peer: answer ``CLOSE`` and return;
* STOP from the server: send ``CLOSE`` first, then read and drop messages
  until the peer's ``CLOSE`` arrives, and return.

The parent calls ``bundle.shutdown(grace=10)`` at 60 s. Three peers show the
three endings: one answers the server's CLOSE after 1 s, one never answers
(hard-cancelled at 70 s), and one closes by itself at 30 s.

Run it (virtual clock)::

    python examples/essay_5_both_closes.py
"""

from __future__ import annotations

import math

import trio
from essay_support import MessageSocket, Timeline, describe, run_virtual, socket_pair

import trio_graceful
from trio_graceful import STOP


async def worker(
    name: str,
    sock: MessageSocket,
    inbox: trio_graceful.InboxReceiver[str],
    log: Timeline,
) -> None:
    while True:
        message = await inbox.until_stop(sock.receive)
        if message is STOP:
            log(name, "STOP: sending CLOSE, waiting for the peer's CLOSE")
            await sock.send("CLOSE")
            while await sock.receive() != "CLOSE":
                pass  # messages after our CLOSE are not processed
            log(name, "closed by the server")
            return
        if message == "CLOSE":
            await sock.send("CLOSE")
            log(name, "closed by the peer")
            return
        await sock.send("Hello, world!")


async def peer(sock: MessageSocket, answer_after: float, close_at: float) -> None:
    with trio.move_on_after(close_at):
        while await sock.receive() != "CLOSE":
            pass
        # The server asked to close: answer (or keep it waiting forever).
        await trio.sleep(answer_after)
        await sock.send("CLOSE")
        return
    await sock.send("CLOSE")  # our own close, at close_at
    await sock.receive()


async def main() -> Timeline:
    log = Timeline()
    peers = {
        "polite": (1.0, math.inf),  # answers the server's CLOSE after 1 s
        "silent": (math.inf, math.inf),  # never answers
        "leaving": (math.inf, 30.0),  # closes by itself at 30 s
    }
    async with trio.open_nursery() as network:
        async with trio_graceful.open_bundle(name="server") as bundle:
            for name, (answer_after, close_at) in peers.items():
                server_sock, client_sock = socket_pair()
                network.start_soon(peer, client_sock, answer_after, close_at)
                _, inbox = bundle.open_inbox()
                bundle.start_soon(worker, name, server_sock, inbox, log, name=name)
            await trio.sleep(60)
            log("main", "shutdown(grace=10)")
            report = await bundle.shutdown(grace=10)
            log("main", f"shutdown returned ({describe(report)})")
        network.cancel_scope.cancel()
    return log


if __name__ == "__main__":
    run_virtual(main)
