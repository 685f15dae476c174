"""examples/asgi_service.py drained over HTTP/2, as a real process, by SIGTERM.

Raw HTTP/2 clients with prior knowledge (tests/support/h2_client.py) read
every frame, so that the test sees whether each stream ended, what each
GOAWAY named and whether a FIN followed the last one. Many connections are
drained at once: each is one more chance for a stream's end to race the
connection's close.
"""

from __future__ import annotations

import signal

import pytest
import trio

from tests.support.asgi_process import PATIENCE, STOP_LINE, open_service
from tests.support.h2_client import H2Client, check_drain

pytestmark = pytest.mark.realtime

CONNECTIONS = 20
STREAMS = 4


async def open_streams(port: int, index: int) -> tuple[H2Client, dict[int, bytes]]:
    """Connect; open `STREAMS` slow streams and a fast one, read its answer.

    Once the fast one is answered, the server has read the others: they
    are in progress. Returns the client and the body each stream expects.
    """
    client = H2Client(await trio.open_tcp_stream("127.0.0.1", port))
    await client.start()
    first = index * 100
    paths = [f"/work?ms=1500&id={first + k}" for k in range(STREAMS)]
    slow = await client.get(*paths)
    [fast] = await client.get(f"/work?ms=0&id={first + STREAMS}")
    with trio.fail_after(PATIENCE):
        await client.read_until_ended(fast)
    bodies = [b'{"id":%d}' % (first + k) for k in range(STREAMS + 1)]
    return client, dict(zip([*slow, fast], bodies, strict=True))


async def drain(client: H2Client, answered: dict[int, bytes]) -> None:
    """Read the GOAWAY, open a stream after it, and read to the end; check."""
    with trio.fail_after(PATIENCE):
        while not client.goaways:
            await client.receive()
        # Sent after the GOAWAY: refused, not processed.
        refused = await client.get("/work?ms=0&id=9999")
        await client.read_to_the_end()
    await client.stream.aclose()
    check_drain(client, answered, refused)
    assert [g.last_stream_id for g in client.goaways] == [max(answered)] * 2


async def test_sigterm_ends_every_http2_stream_then_closes_with_a_fin() -> None:
    async with open_service("--grace", "10") as service:
        opened = [await open_streams(service.port, i) for i in range(CONNECTIONS)]
        service.process.send_signal(signal.SIGTERM)
        async with trio.open_nursery() as nursery:
            for client, answered in opened:
                nursery.start_soon(drain, client, answered)
        [stop] = await service.wait_for(STOP_LINE + r" (\d+) connections")
        assert int(stop.group(1)) == CONNECTIONS
        status = await service.exit_status()
    assert not service.logged(r"asgi: cut-off:"), service.log()
    service.check_graceful_exit(status)
