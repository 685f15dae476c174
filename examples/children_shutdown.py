"""A thread, a subprocess and asyncio code, stopped by one bundle's shutdown.

One bundle runs three children that are not Trio code:

* ``copier``: a thread that copies "chunks" with blocking calls and looks at
  its stop flag between two chunks;
* ``helper``: a subprocess (a small Python script) that cleans up when it
  gets SIGTERM;
* ``websockets``: a server written with the websockets library for asyncio,
  run on the trio-asyncio loop.

A Trio client (trio-websocket) talks to the server. Then
``bundle.shutdown(grace=5)`` asks all three to stop: the flag is set, the
script gets SIGTERM, the asyncio code reads STOP from its inbox and closes
its connections with code 1001. The report says how each child ended.

Run it with (it needs the ``asyncio`` extra, websockets and trio-websocket)::

    pip install -e '.[asyncio,websocket]' websockets
    python examples/children_shutdown.py

Things to try: make ``copy_chunks`` ignore its flag, and the report shows the
thread abandoned at 5 s; make the script ignore SIGTERM
(``signal.signal(signal.SIGTERM, signal.SIG_IGN)``), and it is killed with
SIGKILL at 5 s.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time

import trio
import trio_asyncio
import trio_websocket
from websockets.asyncio.server import ServerConnection, serve

import trio_graceful

HELPER_SCRIPT = """
import signal, sys, time
def stop(signum, frame):
    print("helper: got SIGTERM, cleaning up", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("helper: ready", flush=True)
while True:
    time.sleep(1)
"""


def copy_chunks(stop_flag: trio_graceful.StopFlag, chunks: int) -> int:
    """Blocking work in a thread: stop between two chunks once asked to."""
    copied = 0
    while copied < chunks and not stop_flag.is_set():
        time.sleep(0.01)  # one chunk of blocking I/O
        copied += 1
    return copied


async def copier() -> None:
    copied = await trio_graceful.run_in_thread(copy_chunks, 100_000, name="copy-thread")
    print(f"copier: stopped after {copied} chunks")


async def echo(connection: ServerConnection) -> None:
    async for message in connection:
        await connection.send(message)


async def websocket_server(
    inbox: trio_graceful.AsyncioInbox[object], *, task_status: trio.TaskStatus[int]
) -> None:
    """Serve until STOP, then close the way websockets closes a server."""
    async with serve(echo, "127.0.0.1", 0) as server:
        task_status.started(server.sockets[0].getsockname()[1])
        await inbox.receive()  # STOP
    # Leaving the block closed every connection with 1001 (going away).


async def client(port: int, *, task_status: trio.TaskStatus[None]) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream, trio.open_nursery() as nursery:
        ws = await trio_websocket.wrap_client_stream(nursery, stream, "127.0.0.1", "/")
        await ws.send_message("hello")
        print(f"client: got {await ws.get_message()!r}")
        task_status.started()
        try:
            await ws.get_message()
        except trio_websocket.ConnectionClosed as exc:
            code = None if exc.reason is None else exc.reason.code
            print(f"client: closed by the server with {code}")


async def read_line(stream: trio.abc.ReceiveStream) -> str:
    data = b""
    while not data.endswith(b"\n"):
        data += await stream.receive_some()
    return data.decode().rstrip("\n")


async def main(grace: float = 5) -> trio_graceful.CancelReport:
    async with (
        trio_asyncio.open_loop(),
        trio.open_nursery() as clients,
        trio_graceful.open_bundle(name="service") as bundle,
    ):
        bundle.start_soon(copier, name="copier")
        helper = await bundle.start(
            functools.partial(trio_graceful.run_process, stdout=subprocess.PIPE),
            [sys.executable, "-c", HELPER_SCRIPT],
            name="helper",
        )
        assert helper.stdout is not None
        print(await read_line(helper.stdout))
        port = await bundle.start(
            trio_graceful.run_asyncio, websocket_server, name="websockets"
        )
        await clients.start(client, port)

        print(f"main: shutdown(grace={grace})")
        report = await bundle.shutdown(grace)
        print(await read_line(helper.stdout))

    print(report.summary())
    for child in report.children:
        details = "; ".join(child.notes + child.abandoned)
        print(
            f"  {child.name}: {child.outcome.value} after {child.elapsed:.3f} s"
            + (f" ({details})" if details else "")
        )
    return report


if __name__ == "__main__":
    trio.run(main)
