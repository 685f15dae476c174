"""trio_graceful.mcp.serve_stdio in-process, over real pipes, in exact virtual time.

Each test runs a whole program with `trio_graceful.run` on a MockClock that
jumps when every task waits. The server is the example's (or a small one of
the test's own); a client script, a task of the root bundle, writes requests
to one pipe and reads the answers from the other, and raises real signals
with ``signal.raise_signal``. What the server wrote after the script was
cancelled is read once the run has returned.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing
from mcp.server.mcpserver import MCPServer

import trio_graceful
from tests.support.examples import load_example
from tests.support.mcp_wire import Message, Wire, cancel, request, text_of, tool_call
from trio_graceful.mcp import EXIT_CODES, serve_stdio

Script = Callable[[Wire], Awaitable[None]]
SHUTTING_DOWN = "server is shutting down; "


class Pipes:
    """Two pipes between the server's descriptors and a client's `Wire`."""

    def __init__(self) -> None:
        self.server_in, requests = os.pipe()
        answers, self.server_out = os.pipe()
        self.wire = Wire(requests, answers)

    def close(self) -> None:
        for fd in (self.server_in, self.server_out, self.wire.answers):
            os.close(fd)
        if self.wire.requests is not None:
            os.close(self.wire.requests)


def example_server() -> MCPServer:
    server: MCPServer = load_example("mcp_server").build_server()
    return server


def serve(
    server: MCPServer,
    script: Script,
    *,
    returned: list[float] | None = None,
    **options: Any,
) -> tuple[int, list[Message]]:
    """Serve over pipes while ``script`` plays the client; the status, the rest.

    When `serve_stdio` returned goes to ``returned``.
    """
    pipes = Pipes()

    async def main(*, task_status: trio.TaskStatus[None]) -> None:
        trio_graceful.current_runner().root.start_soon(script, pipes.wire)
        fds = (pipes.server_in, pipes.server_out)
        await serve_stdio(server, fds=fds, task_status=task_status)
        if returned is not None:
            returned.append(trio.current_time())

    options.setdefault("clock", trio.testing.MockClock(autojump_threshold=0))
    try:
        status = trio_graceful.run(main, exit_codes=EXIT_CODES, **options)
        return status, pipes.wire.rest()
    finally:
        pipes.close()


async def sigint_at(when: float) -> None:
    await trio.sleep_until(when)
    signal.raise_signal(signal.SIGINT)


def mcp_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "trio_graceful.mcp"]


@pytest.fixture(autouse=True)
def _logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="trio_graceful")


def test_a_call_in_flight_at_sigint_finishes_and_a_new_request_is_refused(caplog):
    seen: list[tuple[float, object]] = []

    async def script(wire: Wire) -> None:
        await wire.initialize()
        await wire.send(tool_call(1, "sleep", seconds=2.5))
        await sigint_at(1)
        await trio.sleep(0.5)
        await wire.send(tool_call(2, "echo", text="too late"))
        for _ in range(2):
            answer = await wire.answer()
            seen.append((trio.current_time(), answer["id"]))
            if answer["id"] == 1:
                assert text_of(answer) == "slept 2.5"
            else:
                assert answer["error"] == {
                    "code": -32000,
                    "message": SHUTTING_DOWN + "the request was not started",
                }

    status, rest = serve(example_server(), script)
    assert status == 0
    assert rest == []
    assert seen == [(1.5, 2), (2.5, 1)]
    assert mcp_lines(caplog) == [
        "STOP: no new work; 1 call in flight: tools/call sleep (id 1)",
        "refused tools/call echo (id 2): shutting down",
    ]


NO_WORK = [
    "ping",
    "tools/list",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
]
WORK = {"tools/call": {"name": "echo"}, "resources/read": {"uri": "x://y"}}
WORK["prompts/get"] = {"name": "greeting"}


def test_during_the_drain_requests_that_start_no_work_are_answered(caplog):
    answers: dict[object, tuple[float, Message]] = {}

    async def script(wire: Wire) -> None:
        await wire.initialize()
        await wire.send(tool_call(1, "sleep", seconds=2.5))
        await sigint_at(1)
        await trio.sleep(0.5)
        for request_id, method in enumerate([*NO_WORK, *WORK], start=10):
            await wire.send(request(request_id, method, **WORK.get(method, {})))
        for _ in range(len(NO_WORK) + len(WORK) + 1):
            answer = await wire.answer()
            answers[answer["id"]] = (trio.current_time(), answer)

    returned: list[float] = []
    assert serve(example_server(), script, returned=returned) == (0, [])
    answered = {a["id"]: (t, "error" in a) for t, a in answers.values()}
    assert answered == {
        1: (2.5, False),
        **{10 + i: (1.5, False) for i in range(len(NO_WORK))},
        **{15 + i: (1.5, True) for i in range(len(WORK))},
    }
    (_, tools), (_, refused) = answers[11], answers[15]
    assert sorted(tool["name"] for tool in tools["result"]["tools"]) == [
        "blocking_sleep",
        "echo",
        "sleep",
    ]
    assert refused["error"]["message"] == SHUTTING_DOWN + "the request was not started"
    assert returned == [3.0]  # the last call's answer, then the linger
    assert mcp_lines(caplog)[1:] == [
        "refused tools/call echo (id 15): shutting down",
        "refused resources/read (id 16): shutting down",
        "refused prompts/get (id 17): shutting down",
    ]


def test_a_list_request_right_after_the_last_answer_is_answered():
    answers: list[tuple[float, object]] = []

    async def script(wire: Wire) -> None:
        await wire.initialize()
        await wire.send(tool_call(1, "sleep", seconds=2.5))
        await sigint_at(1)
        assert text_of(await wire.answer()) == "slept 2.5"
        await trio.sleep(0.4)  # within the linger, as the SDK's client does
        await wire.send(request(2, "tools/list"))
        answers.append(
            (trio.current_time(), "tools" in (await wire.answer())["result"])
        )
        await trio.sleep_until(3.1)
        await wire.send(request(3, "tools/list"))  # the linger is over: no answer

    returned: list[float] = []
    assert serve(example_server(), script, returned=returned) == (0, [])
    assert answers == [(2.9, True)]
    assert returned == [3.0]


@pytest.mark.parametrize(
    ("options", "returned"),
    [
        ({"grace": 1}, [1.75]),  # half the grace left, 0.25 s
        ({"grace": 10, "close_at": 1.7}, [1.7]),  # the end of input
        ({"grace": 10}, [2.0]),  # the whole linger, 0.5 s
        ({"grace": 10, "call": False}, [1.0]),  # nothing in flight at STOP
    ],
)
def test_what_ends_the_linger(options: dict[str, Any], returned: list[float]):
    async def script(wire: Wire) -> None:
        await wire.initialize()
        if options.get("call", True):
            await wire.send(tool_call(1, "sleep", seconds=1.5))
        await sigint_at(1)
        if "close_at" in options:
            await trio.sleep_until(options["close_at"])
            wire.close_requests()

    ended: list[float] = []
    status, _ = serve(example_server(), script, returned=ended, grace=options["grace"])
    assert (status, ended) == (0, returned)


def test_a_call_that_outlasts_the_grace_gets_an_error_at_the_deadline(caplog):
    async def script(wire: Wire) -> None:
        await wire.initialize()
        await wire.send(tool_call(1, "sleep", seconds=30))
        await sigint_at(1)
        await trio.sleep_forever()  # until the hard cancel

    status, rest = serve(example_server(), script, grace=5)
    assert status == 130
    assert rest == [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "error": {
                "code": -32000,
                "message": SHUTTING_DOWN + "the call was cancelled before it finished",
            },
        }
    ]
    running = "1 call in flight: tools/call sleep (id 1)"
    assert mcp_lines(caplog) == [
        f"STOP: no new work; {running}",
        f"waiting for {running}; 3.0 s of grace left",
        f"waiting for {running}; 1.0 s of grace left",
        f"hard cancel: {running}",
    ]


@pytest.mark.realtime  # the thread waits in real time
def test_a_thread_in_a_tool_hears_stop_and_answers_at_once():
    seen: list[str] = []

    async def script(wire: Wire) -> None:
        await wire.initialize()
        await wire.send(tool_call(1, "blocking_sleep", seconds=30))
        await wire.send(tool_call(2, "echo", text="dispatched"))
        assert text_of(await wire.answer()) == "dispatched"
        signal.raise_signal(signal.SIGINT)
        seen.append(text_of(await wire.answer()))

    status, rest = serve(example_server(), script, grace=60, clock=None)
    assert (status, rest, seen) == (0, [], ["stopped"])


@pytest.mark.realtime  # a real thread and a real process outlast the grace
def test_threads_and_processes_that_ignore_stop_end_at_the_deadline(tmp_path, caplog):
    release = threading.Event()
    pid_file = tmp_path / "pid"
    server = MCPServer("stubborn")

    @server.tool()
    async def stubborn_thread() -> str:
        return await trio_graceful.run_in_thread(lambda _flag: release.wait(60))

    @server.tool()
    async def stubborn_process() -> str:
        script = f"trap '' TERM; echo $$ > {pid_file}; exec sleep 60"
        await trio_graceful.run_process(["sh", "-c", script])
        return "ended"

    async def script(wire: Wire) -> None:
        await wire.initialize()
        await wire.send(tool_call(1, "stubborn_thread"))
        await wire.send(tool_call(2, "stubborn_process"))
        with trio.fail_after(60):
            while not pid_file.exists() or not pid_file.read_text():  # noqa: ASYNC110
                await trio.sleep(0.01)
        signal.raise_signal(signal.SIGINT)
        await trio.sleep_forever()  # until the hard cancel

    try:
        status, rest = serve(server, script, grace=0.5, clock=None)
    finally:
        release.set()
    assert status == 130
    assert sorted((a["id"], a["error"]["message"]) for a in rest) == [
        (1, SHUTTING_DOWN + "the call was cancelled before it finished"),
        (2, SHUTTING_DOWN + "the call was cancelled before it finished"),
    ]
    with pytest.raises(ProcessLookupError):  # killed at the deadline, and reaped
        os.kill(int(pid_file.read_text()), 0)
    (summary,) = [
        r.getMessage()
        for r in caplog.records
        if r.getMessage().startswith("bundle 'root': ") and "finished" in r.getMessage()
    ]
    assert "1 abandoned" in summary  # the thread


def test_the_clients_cancellation_hard_cancels_that_call_only(caplog):
    ended: list[tuple[float, float, bool]] = []
    server = MCPServer("cancellation")

    @server.tool()
    async def wait(seconds: float) -> str:
        cancelled = True
        try:
            await trio.sleep(seconds)
            cancelled = False
        finally:
            ended.append((seconds, trio.current_time(), cancelled))
        return "done"

    answers: list[tuple[float, object]] = []

    async def script(wire: Wire) -> None:
        await wire.initialize()
        for request_id, seconds in ((1, 5.0), (2, 7.0), (3, 4.0)):
            await wire.send(tool_call(request_id, "wait", seconds=seconds))
        await trio.sleep_until(1)
        await wire.send(cancel(2))
        for _ in range(2):
            answer = await wire.answer()
            answers.append((trio.current_time(), answer["id"]))
        wire.close_requests()  # end of input: the program ends

    status, rest = serve(server, script)
    assert (status, rest) == (0, [])
    assert answers == [(4, 3), (5, 1)]
    assert sorted(ended) == [(4.0, 4, False), (5.0, 5, False), (7.0, 1, True)]
    assert "the client cancelled tools/call wait (id 2)" in mcp_lines(caplog)


def test_end_of_input_is_a_graceful_shutdown_with_status_0(caplog):
    seen: list[tuple[float, str]] = []

    async def script(wire: Wire) -> None:
        await wire.initialize()
        await wire.send(tool_call(1, "sleep", seconds=2.5))
        await trio.sleep_until(1)
        wire.close_requests()
        answer = await wire.answer()
        seen.append((trio.current_time(), text_of(answer)))

    assert serve(example_server(), script) == (0, [])
    assert seen == [(2.5, "slept 2.5")]
    assert mcp_lines(caplog) == [
        "end of input; 1 call in flight: tools/call sleep (id 1)"
    ]


def test_a_closed_stdout_is_a_graceful_shutdown_with_status_0(caplog):
    async def script(wire: Wire) -> None:
        await wire.initialize()
        os.close(wire.answers)
        wire.answers = os.open(os.devnull, os.O_RDONLY)  # for Pipes.close
        await wire.send(tool_call(1, "echo", text="nobody reads this"))
        await trio.sleep_forever()  # until the hard cancel; no STOP reaches it

    status, rest = serve(example_server(), script, grace=1)
    assert (status, rest) == (0, [])
    (broken,) = [line for line in mcp_lines(caplog) if "stdout closed" in line]
    assert broken.endswith("Broken pipe): shutting down")


def test_the_handlers_run_as_named_children_of_the_root_bundle():
    seen: list[tuple[str, bool]] = []
    server = MCPServer("children")

    @server.tool()
    async def where() -> str:
        task = trio.lowlevel.current_task()
        seen.append((task.name, task in trio_graceful.current_runner().root))
        return "here"

    async def script(wire: Wire) -> None:
        await wire.initialize()
        await wire.send(tool_call(7, "where"))
        assert text_of(await wire.answer()) == "here"
        wire.close_requests()

    before = list(server.middleware)
    assert serve(server, script) == (0, [])
    assert seen == [("tools/call where (id 7)", True)]
    assert server.middleware == before  # the middleware was taken out again


# -- wrong arguments ------------------------------------------------------------------


async def test_a_server_that_is_not_an_sdk_server_is_refused():
    with pytest.raises(
        TypeError,
        match=r"^server must be an mcp MCPServer or a low-level mcp Server, not 42$",
    ):
        await serve_stdio(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("fds", [(0,), (0, -1), (0, "1"), [0, 1], (True, 1)])
async def test_fds_must_be_a_pair_of_descriptors(fds: object):
    with pytest.raises(
        TypeError,
        match=rf"^fds must be None or a pair of file descriptors \(read, write\), "
        rf"not {re.escape(repr(fds))}$",
    ):
        await serve_stdio(MCPServer("x"), fds=fds)  # type: ignore[arg-type]


async def test_serve_stdio_needs_the_runner():
    with pytest.raises(RuntimeError, match=r"^current_runner\(\) was called outside"):
        await serve_stdio(MCPServer("x"), fds=(0, 1))
