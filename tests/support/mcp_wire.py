"""Talking JSON-RPC to an MCP server over a pair of pipes, the way a client does.

`Wire` is the client's side of two pipes: requests in, answers out, one JSON
object per line. The in-process tests hand the server's ends to
``serve_stdio(fds=...)``; `ServerProcess` gives a subprocess's stdin and
stdout to one. Every wait is for an answer, a log line or an exit, bounded
by ``PATIENCE`` (a busy machine only makes it slower), never a fixed sleep.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from typing import Any

import trio

from tests.support.examples import EXAMPLES
from tests.support.streams import StreamLog

PATIENCE = 60.0
EXAMPLE = EXAMPLES / "mcp_server.py"
# The same server under the SDK's own MCPServer.run() (stdio, in a thread).
SDK_RUN = [
    sys.executable,
    "-c",
    "import runpy, sys; runpy.run_path(sys.argv[1])['build_server']().run()",
    str(EXAMPLE),
]

Message = dict[str, Any]


def request(request_id: int, method: str, **params: object) -> Message:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def tool_call(request_id: int, tool: str, **arguments: object) -> Message:
    return request(request_id, "tools/call", name=tool, arguments=arguments)


def cancel(request_id: int) -> Message:
    return {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": request_id, "reason": "the user changed their mind"},
    }


INITIALIZE = request(
    0,
    "initialize",
    protocolVersion="2025-06-18",
    capabilities={},
    clientInfo={"name": "tests", "version": "1"},
)
INITIALIZED: Message = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def text_of(answer: Message) -> str:
    """The text of a tool call's answer."""
    (content,) = answer["result"]["content"]
    text: str = content["text"]
    return text


class Wire:
    """The client's ends: ``requests`` (written) and ``answers`` (read)."""

    def __init__(self, requests: int | None, answers: int) -> None:
        self.requests = requests
        self.answers = answers
        self._buffer = b""

    async def send(self, message: Message) -> None:
        assert self.requests is not None, "the requests were closed"
        data = json.dumps(message).encode() + b"\n"
        await trio.lowlevel.wait_writable(self.requests)
        assert os.write(self.requests, data) == len(data)

    async def initialize(self) -> None:
        await self.send(INITIALIZE)
        assert (await self.answer())["id"] == 0
        await self.send(INITIALIZED)

    def close_requests(self) -> None:
        """End of input for the server."""
        assert self.requests is not None
        os.close(self.requests)
        self.requests = None

    async def answer(self) -> Message:
        """The next line the server wrote, as JSON."""
        with trio.fail_after(PATIENCE):
            while b"\n" not in self._buffer:
                await trio.lowlevel.wait_readable(self.answers)
                data = os.read(self.answers, 65536)
                assert data, "the server's output ended"
                self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        answer: Message = json.loads(line)
        return answer

    def rest(self) -> list[Message]:
        """The lines the server wrote that were not read yet (it has ended)."""
        while select.select([self.answers], [], [], 0)[0]:
            data = os.read(self.answers, 65536)
            if not data:
                break
            self._buffer += data
        lines, self._buffer = self._buffer.splitlines(), b""
        return [json.loads(line) for line in lines]


class ServerProcess:
    """An MCP server as a subprocess: a `Wire` to it, its stderr, its exit."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        assert process.stdin is not None
        assert process.stdout is not None
        # The raw descriptors: the wire writes and reads them as any client.
        self.wire = Wire(process.stdin.fileno(), process.stdout.fileno())
        assert process.stderr is not None
        self._stderr = StreamLog(process.stderr)

    @classmethod
    async def start(cls, nursery: trio.Nursery, argv: list[str]) -> ServerProcess:
        process = await trio.lowlevel.open_process(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        server = cls(process)
        nursery.start_soon(server._stderr.collect)
        await server.wire.initialize()
        return server

    async def wait_stderr(self, text: str) -> None:
        await self._stderr.wait_for(text, timeout=PATIENCE)

    def kill(self, signum: int = signal.SIGINT) -> None:
        self.process.send_signal(signum)

    async def exit_status(self, *, since: float) -> tuple[int, float]:
        """Wait for the exit and the end of stderr; the status and the seconds since."""
        with trio.fail_after(PATIENCE):
            status = await self.process.wait()
        elapsed = trio.current_time() - since
        await self._stderr.wait_closed(timeout=PATIENCE)
        return status, elapsed

    def clean_stderr(self) -> str:
        text = self._stderr.data.decode()
        assert "Traceback" not in text, text
        assert "could not acquire lock" not in text, text
        return text

    async def stop(self) -> None:
        """Kill it if it still runs (a failed test must not leave it behind)."""
        if self.process.returncode is None:
            self.process.kill()
        with trio.CancelScope(shield=True):
            await self.process.wait()


async def end_input(server: ServerProcess) -> None:
    """Close the server's stdin (the descriptor belongs to the trio.Process)."""
    assert server.process.stdin is not None
    server.wire.requests = None
    await server.process.stdin.aclose()
