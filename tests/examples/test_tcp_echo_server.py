"""examples/tcp_echo_server.py over real loopback sockets.

The sockets are real; the clock is Trio's mock clock without autojump, so
time stands still until a test moves it: the grace runs out exactly when the
test says, however slow the machine is.
"""

from __future__ import annotations

import errno
import functools
import math
import re
import signal
import subprocess
import sys

import pytest
import trio
import trio.testing

import trio_graceful
from tests.support.examples import EXAMPLES, load_example

example = load_example("tcp_echo_server")


async def start_server(
    bundle: trio_graceful.Bundle, grace: float
) -> tuple[trio_graceful.InboxSender[object], int]:
    send, inbox = bundle.open_inbox()
    listeners = await bundle.start(
        functools.partial(example.serve, inbox, port=0, grace=grace)
    )
    return send, listeners[0].socket.getsockname()[1]


async def read(stream: trio.SocketStream, up_to: float = math.inf) -> bytes:
    """Read until end of file, or until ``up_to`` bytes have come."""
    received = b""
    while len(received) < up_to:
        chunk = await stream.receive_some()
        if not chunk:
            break
        received += chunk
    return received


async def connect(port: int) -> trio.SocketStream:
    """Connect and wait for one echo, so the handler is at its idle point."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"hello\n")
    assert await read(stream, up_to=6) == b"hello\n"
    return stream


async def test_every_connection_gets_its_answer_and_a_goodbye(mock_clock, capsys):
    goodbyes: list[bytes] = []

    async def polite(stream: trio.SocketStream) -> None:
        goodbyes.append(await read(stream))
        await stream.aclose()

    async with (
        trio.open_nursery() as clients,
        trio_graceful.open_bundle(name="test") as bundle,
    ):
        _, port = await start_server(bundle, grace=5)
        for _ in range(3):
            clients.start_soon(polite, await connect(port))
        report = await bundle.shutdown(grace=math.inf)
    assert goodbyes == [example.GOODBYE] * 3
    assert report.graceful
    assert capsys.readouterr().out == (
        "bundle 'connections': 3 finished, 0 hard-cancelled, 0 raised, in 0.000 s\n"
    )


async def test_a_client_that_never_closes_is_cut_off_when_the_grace_ends(
    mock_clock, capsys
):
    async with trio_graceful.open_bundle(name="test") as bundle:
        send, port = await start_server(bundle, grace=5)
        polite = await connect(port)
        silent = await connect(port)
        t0 = trio.current_time()
        send.stop()
        # The silent client reads the goodbye and then keeps the connection.
        assert await read(silent, up_to=len(example.GOODBYE)) == example.GOODBYE
        assert await read(polite) == example.GOODBYE
        await polite.aclose()
        # STOP closed the listener before the drain began.
        with pytest.raises(OSError, match=r"^all attempts to connect .* failed$") as e:
            await trio.open_tcp_stream("127.0.0.1", port)
        assert e.value.__cause__ is not None
        assert e.value.__cause__.exceptions[0].errno == errno.ECONNREFUSED
        await trio.testing.wait_all_tasks_blocked()
        assert trio.current_time() == t0
        mock_clock.jump(5)
        # The server hard-cancels the silent connection, which closes it.
        assert await read(silent) == b""
        await silent.aclose()
        report = await bundle.cancel(grace=math.inf)
    assert [child.outcome for child in report.children] == [
        trio_graceful.ChildOutcome.FINISHED
    ]
    assert capsys.readouterr().out == (
        "bundle 'connections': 1 finished, 1 hard-cancelled, 0 raised, in 5.000 s\n"
    )


async def _talk_then_interrupt(port: int, process: subprocess.Popen[bytes]) -> bytes:
    stream = await connect(port)
    process.send_signal(signal.SIGINT)
    goodbye = await read(stream)
    await stream.aclose()
    return goodbye


@pytest.mark.realtime
def test_ctrl_c_drains_the_connections_of_the_script():
    # The script as users run it, under trio_graceful.run, with a real signal;
    # port 0 so that parallel runs do not compete for a port.
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "tcp_echo_server.py"), "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        listening = process.stdout.readline().decode()
        assert listening.startswith("listening on 127.0.0.1:")
        port = int(listening.rsplit(":", 1)[1])
        goodbye = trio.run(_talk_then_interrupt, port, process)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
        process.wait()
    assert goodbye == example.GOODBYE
    assert re.fullmatch(
        r"bundle 'connections': 1 finished, 0 hard-cancelled, 0 raised, "
        r"in \d+\.\d{3} s\n",
        stdout.decode(),
    )
    assert stderr.decode().startswith("SIGINT: shutting down (grace 6 s)\n")
    assert "Traceback" not in stderr.decode()
    assert process.returncode == 130
