"""MCP over Streamable HTTP: six shutdown situations, three servers, measured.

The servers, each a process of its own on 127.0.0.1, serve the same tools
(``sleep(seconds)``, ``echo(text)``):

* ``sdk``: the SDK's own ``MCPServer.run(transport="streamable-http")``
  (uvicorn, asyncio), as a user runs it;
* ``serve_asgi``: the SDK's ``streamable_http_app()`` under
  `trio_graceful.asgi.serve_asgi` and `trio_graceful.run`, nothing else done;
* ``trio_graceful``: ``examples/mcp_http_server.py``
  (`trio_graceful.mcp.streamable_http_app`).

The two trio_graceful servers get ``--grace 2``; uvicorn has no grace unless
one is configured, and none is. A client in raw HTTP (h11 on Trio sockets,
one connection per request) plays each situation on a fresh server and
records what it got, byte for byte, and how long it took from the signal
(wall clock):

1. an idle session: SIGTERM; the exit status and when the process exited;
2. a call in flight (``sleep(1)``): SIGTERM 0.2 s after its stream began;
   whether the result arrived and its stream ended with the terminating
   chunk;
3. after SIGTERM (a ``sleep(3)`` call in flight): a new call in the session
   and a new session, each on a connection opened before the signal, and a
   new connection;
4. a call longer than the grace (``sleep(30)``): whether it got a JSON-RPC
   answer, and how its stream ended;
5. an open GET event stream: how it ended, whether with ``retry:``, and
   when;
6. a second SIGTERM 0.5 s after the first, with a ``sleep(30)`` call in
   flight: how long until the process exited.

Run ``python bench/mcp_http_shutdown.py`` (about a minute); it prints one
table per situation. docs/mcp.rst has the numbers of a run.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.mcp_http import (  # noqa: E402
    Exchange,
    RawSession,
    messages,
    open_raw_session,
    request,
    tool_call,
)

TOOLS = """
import anyio, sys
from mcp.server.mcpserver import MCPServer
server = MCPServer("bench")
@server.tool()
async def sleep(seconds: float) -> str:
    await anyio.sleep(seconds)
    return f"slept {seconds}"
@server.tool()
async def echo(text: str) -> str:
    return text
port = int(sys.argv[1])
"""
SDK = TOOLS + 'server.run(transport="streamable-http", port=port)\n'
SERVE_ASGI = (
    TOOLS
    + """
import functools, logging, signal, trio
import trio_graceful, trio_graceful.asgi
logging.basicConfig(level=logging.INFO)
async def main(*, task_status=trio.TASK_STATUS_IGNORED):
    runner = trio_graceful.current_runner()
    await runner.start_service(
        functools.partial(trio_graceful.asgi.serve_asgi, bind=f"127.0.0.1:{port}"),
        server.streamable_http_app(),
    )
    task_status.started()
    _, inbox = runner.root.open_inbox()
    await inbox.receive()
codes = trio_graceful.ExitCodes(clean_signals=frozenset({signal.SIGTERM}))
sys.exit(trio_graceful.run(main, grace=2, exit_codes=codes))
"""
)
SERVERS: dict[str, Callable[[int], list[str]]] = {
    "sdk": lambda port: [sys.executable, "-c", SDK, str(port)],
    "serve_asgi": lambda port: [sys.executable, "-c", SERVE_ASGI, str(port)],
    "trio_graceful": lambda port: [
        sys.executable,
        str(ROOT / "examples" / "mcp_http_server.py"),
        *("--port", str(port), "--grace", "2"),
    ],
}
PATIENCE = 40.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def refused(port: int) -> bool:
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        return True
    await stream.aclose()
    return False


class Server:
    """One server process, started on a free port, ready once it accepts."""

    def __init__(self, name: str) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            SERVERS[name](self.port),
            stderr=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            cwd=ROOT,
        )

    async def wait_ready(self) -> None:
        with trio.fail_after(PATIENCE):
            while await refused(self.port):  # noqa: ASYNC110 (another process)
                await trio.sleep(0.05)

    def signal(self) -> float:
        self.process.send_signal(signal.SIGTERM)
        return time.monotonic()

    async def exit(self, since: float) -> str:
        with trio.fail_after(PATIENCE):
            while self.process.poll() is None:  # noqa: ASYNC110 (another process)
                await trio.sleep(0.005)
        took = time.monotonic() - since
        return f"status {self.process.returncode} after {took:.2f} s"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


async def ending(exchange: Exchange, since: float) -> str:
    """How a response ended: complete (terminating chunk), cut, or reset."""
    try:
        with trio.fail_after(PATIENCE):
            await exchange.read()
    except AssertionError:
        how = "cut: EOF before the terminating chunk"
    except (trio.BrokenResourceError, OSError):
        how = "cut: connection reset"
    except trio.TooSlowError:
        return f"nothing after {PATIENCE:.0f} s"
    else:
        how = "complete"
    return f"{how} after {time.monotonic() - since:.2f} s"


def answer_of(exchange: Exchange) -> str:
    found: list[dict[str, Any]] = []
    if exchange.headers.get(b"content-type", b"").startswith(b"application/json"):
        if exchange.body:
            found = [json.loads(exchange.body)]
    else:
        found = messages(exchange.body)
    answers = [m for m in found if "id" in m and ("result" in m or "error" in m)]
    if not answers:
        return "no JSON-RPC answer"
    (answer,) = answers
    if "error" in answer:
        return f"error {answer['error']['code']}: {answer['error']['message']}"
    return f"result {answer['result']['content'][0]['text']!r}"


async def start_call(raw: RawSession, seconds: float) -> Exchange:
    """A ``sleep(seconds)`` call, once its stream has begun."""
    call = await raw.send("POST", tool_call(5, "sleep", seconds=seconds))
    return await call.read_headers()


async def idle(server: Server, raw: RawSession) -> list[str]:
    del raw
    return [await server.exit(server.signal())]


async def in_flight(server: Server, raw: RawSession) -> list[str]:
    call = await start_call(raw, 1)
    await trio.sleep(0.2)
    since = server.signal()
    how = await ending(call, since)
    return [f"{answer_of(call)}; {how}", await server.exit(since)]


async def after_signal(server: Server, raw: RawSession) -> list[str]:
    old_call, old_session = await raw.connect(), await raw.connect()
    call = await start_call(raw, 3)
    await trio.sleep(0.2)
    since = server.signal()
    await trio.sleep(0.3)
    new_call = await raw.send("POST", tool_call(9, "echo", text="x"), stream=old_call)
    new_call_how = await ending(new_call, since)
    fresh = RawSession(server.port)
    new_session = await fresh.send("POST", request(0, "initialize"), stream=old_session)
    await ending(new_session, since)
    retry_after = new_session.headers.get(b"retry-after", b"-").decode()
    connection = "refused" if await refused(server.port) else "accepted"
    await ending(call, since)
    return [
        f"new call: HTTP {new_call.status or '-'}, {answer_of(new_call)}; "
        + new_call_how,
        f"new session: HTTP {new_session.status or '-'}, Retry-After {retry_after}",
        f"new connection: {connection}",
        await server.exit(since),
    ]


async def past_grace(server: Server, raw: RawSession) -> list[str]:
    call = await start_call(raw, 30)
    since = server.signal()
    how = await ending(call, since)
    return [f"{answer_of(call)}; {how}", await server.exit(since)]


async def event_stream(server: Server, raw: RawSession) -> list[str]:
    stream = await raw.send("GET", headers={"Accept": "text/event-stream"})
    await stream.read_headers()
    since = server.signal()
    how = await ending(stream, since)
    body = stream.body.replace(b"\r\n", b"\n")
    retry = [line for line in body.split(b"\n") if line.startswith(b"retry:")]
    hint = retry[-1].decode() if retry else "no retry: field"
    return [f"HTTP {stream.status}; {hint}; {how}", await server.exit(since)]


async def second_signal(server: Server, raw: RawSession) -> list[str]:
    await start_call(raw, 30)
    server.signal()
    await trio.sleep(0.5)
    return ["second signal: " + await server.exit(server.signal())]


SITUATIONS = {
    "1. an idle session": idle,
    "2. a call in flight": in_flight,
    "3. new calls and sessions after the signal": after_signal,
    "4. a call longer than the grace": past_grace,
    "5. an open GET event stream": event_stream,
    "6. a second signal": second_signal,
}


async def measure(name: str, situation: str) -> list[str]:
    server = Server(name)
    try:
        await server.wait_ready()
        async with open_raw_session(server.port) as raw:
            return await SITUATIONS[situation](server, raw)
    finally:
        server.kill()


async def main() -> None:
    for situation in SITUATIONS:
        print(f"\n{situation}")
        for name in SERVERS:
            for line in await measure(name, situation):
                print(f"  {name:14} {line}")


if __name__ == "__main__":
    trio.run(main)
