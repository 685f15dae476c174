"""Essay example 6: nested bundles. The outer deadline wins.

A worker hands each request to a nested worker in its own bundle and answers
at once. When it gets STOP it shuts its nested bundle down with a *20 s*
grace. But the parent only granted *10 s*: when that deadline comes, the
worker's ``shutdown(grace=20)`` is itself hard-cancelled, and so are the
nested workers. Everything ends at 70 s. If the nested workers finish sooner
(``NESTED_WORK`` of 3 s after shutdown), everything returns then.

Run it (virtual clock)::

    python examples/essay_6_nested.py

Try: ``main(nested_work=3)``.
"""

from __future__ import annotations

import trio
from essay_support import MessageSocket, Timeline, describe, run_virtual, socket_pair

import trio_graceful
from trio_graceful import STOP

NESTED_WORK = 100.0  # how long each nested worker takes


async def nested_worker(request: str, work: float, log: Timeline) -> None:
    try:
        await trio.sleep(work)
        log("nested", f"finished {request!r}")
    except trio.Cancelled:
        log("nested", f"hard-cancelled on {request!r}")
        raise


async def worker(
    sock: MessageSocket,
    inbox: trio_graceful.InboxReceiver[str],
    work: float,
    log: Timeline,
) -> None:
    async with trio_graceful.open_bundle(name="requests") as nested:
        while True:
            request = await inbox.until_stop(sock.receive)
            if request is STOP:
                log("worker", "STOP: shutting nested workers down, grace 20 s")
                try:
                    report = await nested.shutdown(grace=20)
                except trio.Cancelled:
                    log("worker", "the outer deadline cut the nested grace short")
                    raise
                log("worker", f"nested bundle done ({describe(report)})")
                return
            nested.start_soon(nested_worker, request, work, log, name=request)
            await sock.send("Hello, world!")


async def client(sock: MessageSocket) -> None:
    for i in range(2):
        await sock.send(f"request-{i}")
        await sock.receive()


async def main(nested_work: float = NESTED_WORK) -> Timeline:
    log = Timeline()
    server_sock, client_sock = socket_pair()
    async with trio.open_nursery() as network:
        network.start_soon(client, client_sock)
        async with trio_graceful.open_bundle(name="main") as bundle:
            _, inbox = bundle.open_inbox()
            # the nested workers start at 0 s; make them finish `nested_work`
            # seconds after the shutdown begins at 60 s
            work = 60 + nested_work
            bundle.start_soon(worker, server_sock, inbox, work, log, name="worker")
            await trio.sleep(60)
            log("main", "shutdown(grace=10)")
            report = await bundle.shutdown(grace=10)
            log("main", f"shutdown returned ({describe(report)})")
        network.cancel_scope.cancel()
    return log


if __name__ == "__main__":
    run_virtual(main)
