"""The lifeline: workers whose supervisor died stop by themselves, drained.

The pieces with a pipe of this process; then the whole with real processes:
a supervisor SIGKILLed (no cgroup to clean up after it) while a request
runs. Every wait is for a log line or a state; the bounds are only guards
against a hang.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from typing import cast

import h11
import pytest
import trio
import trio.testing

import trio_graceful
from tests.support.processes import PATIENCE, stat_of
from tests.support.workers import asgi_command, get_statusz, open_supervisor
from trio_graceful.workers import inherited_lifeline, watch_supervisor
from trio_graceful.workers._workerprocess import LIFELINE_VARIABLE


def test_inherited_lifeline_takes_the_descriptor_out_of_reach_of_children():
    read_end, write_end = os.pipe()
    try:
        os.set_inheritable(read_end, True)  # as pass_fds leaves it in a worker
        environ = {LIFELINE_VARIABLE: str(read_end), "OTHER": "x"}
        assert inherited_lifeline(environ) == read_end
        assert environ == {"OTHER": "x"}
        assert not os.get_inheritable(read_end)
        # A program the app starts, even with close_fds=False, has no such
        # descriptor (or an unrelated one of its own).
        probe = f"import os, sys; os.fstat({read_end}); sys.exit(7)"
        child = subprocess.run([sys.executable, "-c", probe], close_fds=False)
        assert child.returncode == 1
    finally:
        os.close(read_end)
        os.close(write_end)


@pytest.mark.parametrize(
    ("environ", "error", "message"),
    [
        ({}, LookupError, r"^\$TRIO_GRACEFUL_WORKER_LIFELINE is not set: "),
        ({LIFELINE_VARIABLE: "x"}, ValueError, r"must be a descriptor, not 'x'$"),
        ({LIFELINE_VARIABLE: "987654"}, ValueError, r"descriptor 987654 is not open"),
    ],
)
def test_inherited_lifeline_refuses_what_is_no_lifeline(
    environ: dict[str, str], error: type[Exception], message: str
):
    with pytest.raises(error, match=message):
        inherited_lifeline(environ)


def test_watch_supervisor_shuts_the_program_down_at_end_of_file(
    caplog: pytest.LogCaptureFixture,
):
    read_end, write_end = os.pipe()
    environ = {LIFELINE_VARIABLE: str(read_end)}
    seen: list[object] = []

    async def main(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
        runner = trio_graceful.current_runner()
        watch = functools.partial(watch_supervisor, environ=environ)
        await runner.start_service(watch)
        task_status.started()
        _, inbox = runner.root.open_inbox()
        with trio.fail_after(PATIENCE):
            await trio.testing.wait_all_tasks_blocked()
            assert not seen
            os.close(write_end)  # as the kernel does when the supervisor dies
            seen.append(await inbox.receive())

    assert trio_graceful.run(main) == 0
    assert seen == [trio_graceful.STOP]
    assert "the supervisor is gone: this worker stops" in caplog.text
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(read_end)  # the service closed its end


@pytest.mark.realtime
async def test_workers_of_a_killed_supervisor_drain_and_exit():
    command = asgi_command(
        *("--bind", "127.0.0.1:0", "--workers", "2", "--health-port", "0"),
        *("--grace", "60"),
    )
    async with open_supervisor(command, workers=2) as supervisor:
        pids = supervisor.worker_pids()
        [health] = await supervisor.wait_for(r"health endpoint on port (\d+)")
        async with await trio.open_tcp_stream("127.0.0.1", supervisor.port) as stream:
            client = h11.Connection(h11.CLIENT)
            request = h11.Request(
                method="GET", target="/work?ms=3000&id=5", headers=[("Host", "x")]
            )
            await stream.send_all(
                (client.send(request) or b"") + (client.send(h11.EndOfMessage()) or b"")
            )
            await wait_in_flight(int(health[1]), 1)
            supervisor.process.kill()
            # Both workers notice, the one with the request included.
            await supervisor.wait_for(r"the supervisor is gone: this worker stops", 2)
            response, body = await read_response(client, stream)
        # Answered during the drain: the last answer on its connection.
        assert response.status_code == 200
        assert (b"connection", b"close") in response.headers
        assert body == b'{"id":"5"}'
        # The log ends once every worker has exited and closed it.
        assert await supervisor.exit_status() == -signal.SIGKILL
        assert len(supervisor.lines_matching(r"exiting with status 0")) == 2
        for pid in pids.values():
            await wait_gone(pid)


async def wait_gone(pid: int) -> None:
    """Wait until ``pid`` has exited (a zombie of whoever adopted it counts)."""
    with trio.fail_after(PATIENCE):
        while True:
            state = stat_of(pid)
            if state is None or state[0] == "Z":
                return
            await trio.sleep(0.05)


async def wait_in_flight(port: int, total: int) -> None:
    """Wait until the workers say, at ``/statusz``, that they run ``total`` requests."""
    with trio.fail_after(PATIENCE):
        while True:
            pool = (await get_statusz(port))["workers"]
            assert isinstance(pool, dict)
            workers = cast("list[dict[str, int | None]]", pool["workers"])
            if sum(worker["requests_in_flight"] or 0 for worker in workers) == total:
                return
            await trio.sleep(0.05)


async def read_response(
    client: h11.Connection, stream: trio.SocketStream
) -> tuple[h11.Response, bytes]:
    response = None
    body = b""
    with trio.fail_after(PATIENCE):
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                client.receive_data(await stream.receive_some())
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert response is not None
                return response, body
