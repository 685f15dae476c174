"""A stdio service with the shape of an MCP server, that always exits.

It reads JSON-RPC 2.0 requests, one per line, on stdin and writes one answer
per line on stdout, the way an MCP server speaks to its client over stdio.
Its parts start in this order and stop in the reverse order:

1. ``state``: counters loaded from a JSON file at startup and saved when the
   service stops (a resource, `Runner.enter_resource`);
2. ``worker``: runs blocking jobs in a thread, one at a time (a service);
3. ``heartbeat``: a periodic background task (a service);

then ``main`` answers requests until STOP or the end of its input. Methods:

* ``ping``: answers ``"pong"``;
* ``hash`` with ``{"text": ..., "seconds": s}``: the worker thread sleeps
  ``s`` seconds (slow blocking work) and answers the SHA-256 of the text;
* ``stats``: the counters;
* ``hang``: starts a task that waits forever in a shielded cancel scope;
* ``freeze`` with ``{"seconds": s}``: blocks the Trio thread itself.

The last two are faults on purpose, to show the emergency exit.

Run it, type a request and press Enter::

    python examples/stdio_service.py --state /tmp/state.json
    {"jsonrpc": "2.0", "id": 1, "method": "ping"}

Try:

* Ctrl+C: the service finishes the request in hand, stops its parts in
  reverse order, saves its state and exits with status 130; ``kill -TERM``
  does the same with status 0; Ctrl+D (end of input) too, with status 0.
* ``{"id": 2, "method": "hash", "params": {"text": "x", "seconds": 60}}``
  then Ctrl+C: the shutdown waits for the answer; Ctrl+C again forces it, and
  the service exits at once, abandoning the thread.
* ``{"id": 3, "method": "hang"}`` then Ctrl+C twice: the hung task cannot be
  cancelled, so after the unwind budget the watchdog ends the process with
  status 137 and prints where every task was waiting.
* ``{"id": 4, "method": "freeze", "params": {"seconds": 600}}`` then Ctrl+C
  three times: Trio cannot run at all, and the watchdog still exits.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any, cast

import trio

import trio_graceful
from trio_graceful import STOP

logger = logging.getLogger("stdio_service")


@dataclasses.dataclass
class State:
    """What the service remembers from one run to the next."""

    runs: int = 0
    requests: int = 0
    ticks: int = 0


def load_state(path: Path) -> State:
    """Read the state; a missing file means a first run.

    A file that cannot be read, or a folder where it cannot be saved, fails
    the startup rather than the shutdown.
    """
    if path.exists():
        return State(**json.loads(path.read_text()))
    if not path.parent.is_dir():
        raise FileNotFoundError(f"no folder {str(path.parent)!r} for the state file")
    return State()


def save_state(path: Path, state: State) -> None:
    """Write the state atomically: a crash leaves the old file or the new one."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(dataclasses.asdict(state)))
    os.replace(temporary, path)


@contextlib.asynccontextmanager
async def saved_state(path: Path) -> AsyncGenerator[State, None]:
    """Load the state at startup; save it when the service stops."""
    state = await trio.to_thread.run_sync(load_state, path)
    state.runs += 1
    try:
        yield state
    finally:
        # Synchronous (a small file), so that it completes even when the
        # shutdown is forced and every await would be cancelled.
        save_state(path, state)
        logger.info("state saved to %s", path)


def respond(request_id: object, *, result: object = None, error: Any = None) -> None:
    """Write one JSON-RPC answer line to stdout."""
    answer: dict[str, object] = {"jsonrpc": "2.0", "id": request_id}
    if error is not None:
        answer["error"] = error
    else:
        answer["result"] = result
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


@dataclasses.dataclass
class Job:
    """Blocking work for the worker thread, and whom to answer."""

    request_id: object
    function: Callable[..., object]
    args: tuple[object, ...]


async def worker(
    inbox: trio_graceful.InboxReceiver[Any],
    *,
    task_status: trio.TaskStatus[trio.MemorySendChannel[Job]] = (
        trio.TASK_STATUS_IGNORED
    ),
) -> None:
    """Run jobs in a thread, one at a time; answer the queued ones before stopping."""
    send, jobs = trio.open_memory_channel[Job](16)
    task_status.started(send)
    while True:
        job = await inbox.until_stop(jobs.receive)
        if job is STOP:
            break
        await run_job(job)
    # main stops before the worker, so nothing is added from now on.
    while True:
        try:
            job = jobs.receive_nowait()
        except trio.WouldBlock:
            break
        await run_job(job)


async def run_job(job: Job) -> None:
    # A thread cannot be cancelled: a hard cancel abandons it.
    result = await trio.to_thread.run_sync(
        job.function, *job.args, abandon_on_cancel=True
    )
    respond(job.request_id, result=result)


def slow_hash(text: str, seconds: float) -> str:
    time.sleep(seconds)  # stands for slow blocking work: a model, a database
    return hashlib.sha256(text.encode()).hexdigest()


async def heartbeat(
    inbox: trio_graceful.InboxReceiver[Any],
    state: State,
    period: float,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Count ticks every ``period`` seconds until STOP."""
    task_status.started()
    while await inbox.until_stop(trio.sleep, period) is not STOP:
        state.ticks += 1


async def hang() -> None:
    """A fault: a task that no cancellation can reach."""
    with trio.CancelScope(shield=True):
        await trio.sleep_forever()


async def serve(
    state_path: Path,
    period: float,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Start the parts, then answer requests until STOP or end of input."""
    runner = trio_graceful.current_runner()
    state = await runner.enter_resource(saved_state(state_path), name="state")
    jobs = await runner.start_service(worker, name="worker")
    await runner.start_service(heartbeat, state, period, name="heartbeat")
    _, inbox = runner.root.open_inbox()
    async with trio_graceful.open_stdin_lines() as lines:

        async def next_line() -> bytes | None:
            try:
                return await lines.receive()
            except trio.EndOfChannel:
                return None

        task_status.started()
        while True:
            line = await inbox.until_stop(next_line)
            if line is STOP:
                logger.info("STOP: no more requests")
                break
            if line is None:
                logger.info("end of input")
                break
            if line.strip():
                state.requests += 1
                await handle(line, state, jobs, runner)


async def handle(
    line: bytes,
    state: State,
    jobs: trio.MemorySendChannel[Job],
    runner: trio_graceful.Runner,
) -> None:
    """Answer one request line."""
    try:
        request: Any = json.loads(line)
    except ValueError:
        respond(None, error={"code": -32700, "message": "parse error"})
        return
    if not isinstance(request, dict):
        respond(None, error={"code": -32600, "message": "invalid request"})
        return
    fields = cast("dict[str, object]", request)
    method = fields.get("method")
    if not isinstance(method, str):
        respond(None, error={"code": -32600, "message": "invalid request"})
        return
    request_id = fields.get("id")
    try:
        await dispatch(
            request_id,
            method,
            fields.get("params") or {},
            state,
            jobs,
            runner,
        )
    except (KeyError, TypeError, ValueError) as exc:
        respond(request_id, error={"code": -32602, "message": f"bad params: {exc}"})


async def dispatch(
    request_id: object,
    method: str,
    params: Any,
    state: State,
    jobs: trio.MemorySendChannel[Job],
    runner: trio_graceful.Runner,
) -> None:
    """Carry out one method."""
    if method == "ping":
        respond(request_id, result="pong")
    elif method == "stats":
        respond(request_id, result=dataclasses.asdict(state))
    elif method == "hash":
        seconds = float(params.get("seconds", 0))
        await jobs.send(Job(request_id, slow_hash, (str(params["text"]), seconds)))
    elif method == "hang":
        runner.root.start_soon(hang, name="hang")
        respond(request_id, result="hanging")
    elif method == "freeze":
        respond(request_id, result="freezing")
        time.sleep(float(params.get("seconds", 0)))  # noqa: ASYNC251 (the fault)
    else:
        respond(request_id, error={"code": -32601, "message": "method not found"})


def _period(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise argparse.ArgumentTypeError(
            f"heartbeat must be a positive number of seconds, not {text!r}"
        )
    return seconds


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run the service, return its exit status."""
    parser = argparse.ArgumentParser(
        description="A stdio service with the shape of an MCP server."
    )
    parser.add_argument("--state", default="stdio_service_state.json")
    parser.add_argument("--heartbeat", type=_period, default=1.0)
    trio_graceful.add_run_arguments(parser, grace=5.0, unwind_budget=2.0)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    return trio_graceful.run(
        serve,
        Path(args.state),
        args.heartbeat,
        name="stdio_service",
        **trio_graceful.run_arguments(args),
    )


if __name__ == "__main__":
    sys.exit(main())
