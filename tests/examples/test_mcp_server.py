"""examples/mcp_server.py as a real subprocess, with real signals and real pipes.

Raw JSON-RPC over the pipes for each rule of a stop, several servers at once
(starting one costs a second of imports); the exits whose speed matters one
at a time, so that the others do not slow them down. The SDK's own client
(``stdio_client``, ``ClientSession``) against the example. And, side by side,
the same server under the SDK's own ``MCPServer.run()``, which a SIGINT does
not stop. Readiness is always an answer or a log line: a request is known to
be in flight once the answer to a request sent after it has come back.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.stdio import get_default_environment
from mcp_types import CallToolResult, TextContent

import trio_graceful
from tests.support.mcp_wire import (
    EXAMPLE,
    SDK_RUN,
    ServerProcess,
    end_input,
    request,
    text_of,
    tool_call,
)
from tests.support.processes import children_of

pytestmark = pytest.mark.realtime

CANCELLED = {
    "code": -32000,
    "message": "server is shutting down; the call was cancelled before it finished",
}
REFUSED = {
    "code": -32000,
    "message": "server is shutting down; the request was not started",
}
# Far below the 30 s grace: the exit did not wait for the drain. How fast it
# is (hundredths of a second) is for the docs' table, not for a test on a
# shared machine, where a load that stalls a process half a second is no bug.
AT_ONCE = 10.0


def example(grace: float) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--grace", str(grace)]


async def in_flight(server: ServerProcess, request_id: int, tool: str, **args: object):
    """Send a call and make sure the server has it: an echo sent after it returns."""
    await server.wire.send(tool_call(request_id, tool, **args))
    await server.wire.send(tool_call(request_id + 100, "echo", text="handshake"))
    assert text_of(await server.wire.answer()) == "handshake"


Scenario = Callable[[ServerProcess], Awaitable[None]]


async def finishes_its_call_and_refuses_new_ones(server: ServerProcess) -> None:
    await in_flight(server, 1, "sleep", seconds=1.5)
    server.kill(signal.SIGINT)
    await server.wait_stderr("STOP: no new work")
    await server.wire.send(tool_call(2, "echo", text="too late"))
    assert (await server.wire.answer())["error"] == REFUSED
    # Requests that start no work are still answered.
    await server.wire.send(request(3, "tools/list"))
    assert len((await server.wire.answer())["result"]["tools"]) == 3
    await server.wire.send(request(4, "ping"))
    assert await server.wire.answer() == {"jsonrpc": "2.0", "id": 4, "result": {}}
    assert text_of(await server.wire.answer()) == "slept 1.5"
    # The answer a client asks for right after the result (the SDK's does).
    await server.wire.send(request(5, "tools/list"))
    assert (await server.wire.answer())["id"] == 5
    status, elapsed = await server.exit_status(since=trio.current_time())
    assert status == 0
    assert elapsed < AT_ONCE  # the linger is half a second
    text = server.clean_stderr()
    assert "STOP: no new work; 1 call in flight: tools/call sleep (id 1)" in text


async def cuts_off_a_call_at_the_end_of_the_grace(server: ServerProcess) -> None:
    await in_flight(server, 1, "sleep", seconds=60)
    start = trio.current_time()
    server.kill(signal.SIGINT)
    assert (await server.wire.answer())["error"] == CANCELLED
    status, elapsed = await server.exit_status(since=start)
    assert status == 130  # forced by the grace: 128 + SIGINT
    assert elapsed >= 1  # the grace
    text = server.clean_stderr()
    assert "hard cancel: 1 call in flight: tools/call sleep (id 1)" in text


async def ends_at_end_of_input(server: ServerProcess) -> None:
    await in_flight(server, 1, "sleep", seconds=1)
    await end_input(server)
    assert text_of(await server.wire.answer()) == "slept 1.0"
    status, _ = await server.exit_status(since=trio.current_time())
    assert status == 0
    assert "end of input; 1 call in flight" in server.clean_stderr()


async def stops_a_thread_at_stop(server: ServerProcess) -> None:
    await in_flight(server, 1, "blocking_sleep", seconds=60)
    server.kill(signal.SIGTERM)
    assert text_of(await server.wire.answer()) == "stopped"
    status, _ = await server.exit_status(since=trio.current_time())
    assert status == 0
    server.clean_stderr()


async def under_the_sdks_run_sigint_is_no_clean_exit(server: ServerProcess) -> None:
    server.kill(signal.SIGINT)
    with trio.move_on_after(3):
        await server.process.wait()
    # Mostly still running, its stdin thread waiting for the client; on a
    # busy machine sometimes killed by the signal instead, and once seen
    # ending with status 1. Never a graceful exit.
    assert server.process.returncode in (None, -signal.SIGINT, 1)


# A tool that prints and a subprocess that reads stdin: neither may touch the wire.
CHATTY = """
import sys, trio_graceful, trio_graceful.mcp
from mcp.server.mcpserver import MCPServer

server = MCPServer("chatty")

@server.tool()
async def chatty() -> str:
    print("noise from a tool", flush=True)
    done = await trio_graceful.run_process(["cat"], capture_stdout=True)
    return f"cat read {len(done.stdout)} bytes"

sys.exit(trio_graceful.run(trio_graceful.mcp.serve_stdio, server))
"""


async def keeps_the_wire_to_itself(server: ServerProcess) -> None:
    await server.wire.send(tool_call(1, "chatty"))
    assert text_of(await server.wire.answer()) == "cat read 0 bytes"
    await end_input(server)
    status, _ = await server.exit_status(since=trio.current_time())
    assert (status, server.wire.rest()) == (0, [])
    assert "noise from a tool\n" in server.clean_stderr()


# The heap is frozen at exit, before the interpreter's last collection.
FROZEN = """
import atexit, gc, sys, trio_graceful, trio_graceful.mcp
from mcp.server.mcpserver import MCPServer

# Registered first, so it runs last: after serve_stdio's own.
atexit.register(lambda: print(f"frozen: {gc.get_freeze_count() > 0}", file=sys.stderr))
sys.exit(trio_graceful.run(trio_graceful.mcp.serve_stdio, MCPServer("frozen")))
"""


async def freezes_the_heap_at_exit(server: ServerProcess) -> None:
    await end_input(server)
    status, _ = await server.exit_status(since=trio.current_time())
    assert status == 0
    assert "frozen: True" in server.clean_stderr()


async def run_at_once(scenarios: list[tuple[list[str], Scenario]]) -> None:
    async with trio.open_nursery() as nursery:
        servers: list[ServerProcess] = []
        try:
            async with trio.open_nursery() as running:
                for argv, scenario in scenarios:

                    async def play(argv: list[str] = argv, play: Scenario = scenario):
                        server = await ServerProcess.start(nursery, argv)
                        servers.append(server)
                        await play(server)

                    running.start_soon(play)
        finally:
            for server in servers:
                await server.stop()
            nursery.cancel_scope.cancel()  # the stderr collectors


async def test_each_way_to_stop_the_example():
    await run_at_once(
        [
            (example(30), finishes_its_call_and_refuses_new_ones),
            (example(1), cuts_off_a_call_at_the_end_of_the_grace),
            (example(30), ends_at_end_of_input),
            (example(30), stops_a_thread_at_stop),
            (SDK_RUN, under_the_sdks_run_sigint_is_no_clean_exit),
            ([sys.executable, "-c", CHATTY], keeps_the_wire_to_itself),
            ([sys.executable, "-c", FROZEN], freezes_the_heap_at_exit),
        ]
    )


async def test_idle_sigint_and_a_second_sigint_exit_at_once():
    async with trio.open_nursery() as nursery:
        idle = await ServerProcess.start(nursery, example(30))
        busy = await ServerProcess.start(nursery, example(30))
        try:
            # One at a time, so that neither slows the other down.
            start = trio.current_time()
            idle.kill(signal.SIGINT)
            status, elapsed = await idle.exit_status(since=start)
            print(f"\nidle, SIGINT: exit {status} after {elapsed:.3f} s")
            assert (status, idle.wire.rest()) == (0, [])
            assert elapsed < AT_ONCE
            idle.clean_stderr()

            await in_flight(busy, 1, "sleep", seconds=60)
            busy.kill(signal.SIGINT)
            await busy.wait_stderr("STOP: no new work")
            start = trio.current_time()
            busy.kill(signal.SIGINT)
            status, elapsed = await busy.exit_status(since=start)
            print(
                f"a call in flight, SIGINT twice: exit {status} after {elapsed:.3f} s"
            )
            assert status == 130
            assert elapsed < AT_ONCE
            assert [a.get("error") for a in busy.wire.rest()] == [CANCELLED]
            assert "forcing: SIGINT again" in busy.clean_stderr()
        finally:
            for server in (idle, busy):
                await server.stop()
            nursery.cancel_scope.cancel()


def sdk_client_parameters() -> StdioServerParameters:
    """The example for the SDK's client, which passes on only a few variables.

    Without ``PYTHONPATH`` the example would import the trio_graceful that is
    installed, not the one under test.
    """
    env = get_default_environment()
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(trio_graceful.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    )
    return StdioServerParameters(command=sys.executable, args=[str(EXAMPLE)], env=env)


def examples_running() -> list[int]:
    """The example servers this process started (the SDK's client hides its pid)."""
    return [
        child
        for child in children_of(os.getpid())
        if str(EXAMPLE) in Path(f"/proc/{child}/cmdline").read_text()
    ]


async def test_the_sdks_own_client(tmp_path: Path):
    parameters = sdk_client_parameters()
    errors = tmp_path / "stderr"
    with errors.open("w") as errlog:
        async with (
            stdio_client(parameters, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            tools = await session.list_tools()
            assert sorted(tool.name for tool in tools.tools) == [
                "blocking_sleep",
                "echo",
                "sleep",
            ]
            (pid,) = examples_running()
            results: list[str] = []

            async def call_sleep() -> None:
                result = await session.call_tool("sleep", {"seconds": 1.5})
                (content,) = result.content
                assert isinstance(content, TextContent)
                results.append(content.text)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call_sleep)
                # Answered after the sleep was read: it is in flight.
                echoed = await session.call_tool("echo", {"text": "handshake"})
                assert not echoed.is_error
                os.kill(pid, signal.SIGINT)
            assert results == ["slept 1.5"]
    text = errors.read_text()
    assert "Traceback" not in text, text
    assert "STOP: no new work; 1 call in flight: tools/call sleep" in text


async def test_the_sdks_client_gets_the_result_of_a_call_in_flight_at_sigint(
    tmp_path: Path,
):
    # As in the docs: no list_tools first, so after the result the client asks
    # for tools/list, to check it against the tool's output schema.
    parameters = sdk_client_parameters()
    errors = tmp_path / "stderr"
    with errors.open("w") as errlog:
        async with (
            stdio_client(parameters, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            (pid,) = examples_running()
            results: list[CallToolResult] = []

            async def call_sleep() -> None:
                results.append(await session.call_tool("sleep", {"seconds": 1.5}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call_sleep)
                await session.send_ping()  # answered after the call was read
                os.kill(pid, signal.SIGINT)
            (result,) = results
            assert not result.is_error
            assert result.structured_content == {"result": "slept 1.5"}
    text = errors.read_text()
    assert "Traceback" not in text, text
    assert "STOP: no new work; 1 call in flight: tools/call sleep" in text
    assert "refused" not in text, text
