"""A TCP echo server that shuts down gracefully.

Every connection is a child of a bundle, passed to `trio.serve_tcp` as its
``handler_nursery``. At STOP the server stops accepting (the listener
closes) and each connection answers what it has received, says goodbye and
waits for its client to close; ``grace`` bounds that wait, and a client that
never closes is cut off when it runs out.

Run it, connect with ``nc 127.0.0.1 8007`` from another terminal, type a few
lines, then press Ctrl+C where the server runs::

    python examples/tcp_echo_server.py [PORT]

Try: keep nc open after the goodbye, and watch the server cut it off when
the 5 seconds of grace are up.
"""

from __future__ import annotations

import argparse
import functools
import sys

import trio

import trio_graceful
from trio_graceful import STOP

PORT = 8007
GRACE = 5.0
GOODBYE = b"server shutting down, goodbye\n"


async def echo(stream: trio.SocketStream) -> None:
    """Echo what the client sends until STOP, then say goodbye."""
    # This task is a child of the connections' bundle, whose shutdown() puts
    # STOP in every inbox opened on it.
    _, inbox = trio_graceful.current_bundle().open_inbox()
    async with stream:
        while True:
            # The idle point: a wait for the client that STOP can interrupt.
            data = await inbox.until_stop(stream.receive_some)
            if data is STOP:
                break
            if not data:
                return  # the client closed first
            await stream.send_all(data)  # what was received is answered
        await stream.send_all(GOODBYE)
        await stream.send_eof()
        while await stream.receive_some():  # until the client closes too
            pass


async def serve(
    inbox: trio_graceful.InboxReceiver[object],
    *,
    port: int = PORT,
    grace: float = GRACE,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = (
        trio.TASK_STATUS_IGNORED
    ),
) -> None:
    """Accept connections until STOP comes in ``inbox``, then drain them."""
    async with trio_graceful.open_bundle(name="connections") as connections:
        accept = functools.partial(
            trio.serve_tcp,
            echo,
            port,
            host="127.0.0.1",
            # trio.serve_tcp annotates this argument as trio.Nursery, which
            # only Trio can create; as_nursery() is the bundle itself, typed
            # as one (a Bundle has everything serve_tcp uses).
            handler_nursery=connections.as_nursery(),
            task_status=task_status,
        )
        # Cancelling serve_tcp only closes the listener: the connections are
        # children of the bundle and live on.
        await inbox.until_stop(accept)
        report = await connections.shutdown(grace=grace)
        print(report.summary())


async def main(
    port: int = PORT, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Ready once it listens: a port in use fails the startup, in one line."""
    _, inbox = trio_graceful.current_runner().root.open_inbox()  # STOP comes here
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(serve, inbox, port=port))
        host, port = listeners[0].socket.getsockname()[:2]
        print(f"listening on {host}:{port}", flush=True)
        task_status.started()


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"port must be from 0 to 65535, not {text!r}")
    return int(text)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A TCP echo server.")
    parser.add_argument("port", type=_port, nargs="?", default=PORT)
    # One second more than the connections get, to close and report.
    sys.exit(trio_graceful.run(main, parser.parse_args().port, grace=GRACE + 1))
