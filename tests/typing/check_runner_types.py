"""Checked by mypy --strict and pyright --strict in CI, never run.

It pins the typing promises of the runner: run() checks main's arguments
and returns the exit status, resources keep their type, lines are bytes.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncGenerator

import trio
from typing_extensions import Never, assert_type

from trio_graceful import (
    Bundle,
    ExitCodes,
    InboxReceiver,
    Lifecycle,
    LifecycleState,
    RunArguments,
    Runner,
    StdinLines,
    StopType,
    add_run_arguments,
    current_runner,
    open_stdin_lines,
    run,
    run_arguments,
)


@contextlib.asynccontextmanager
async def open_database(path: str) -> AsyncGenerator[dict[str, int], None]:
    yield {path: 1}


async def cache(
    inbox: InboxReceiver[object],
    size: int,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    task_status.started(f"cache of {size}")
    await inbox.receive()


async def ready(
    inbox: InboxReceiver[Never],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    task_status.started()
    assert_type(await inbox.receive(), StopType)


async def pair(
    inbox: InboxReceiver[object],
    number: int,
    text: str,
    ratio: float,
    *,
    task_status: trio.TaskStatus[tuple[int, str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    task_status.started((number, text))
    await inbox.receive()


# task_status has Trio's usual default, so that main fits run()'s signature.
async def main(
    path: str, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    runner = current_runner()
    assert_type(runner, Runner)
    assert_type(runner.root, Bundle)
    assert_type(runner.lifecycle, Lifecycle)
    assert_type(runner.lifecycle.state, LifecycleState)
    database = await runner.enter_resource(open_database(path), name="db")
    assert_type(database, dict[str, int])
    # start_service returns what the service's task_status.started() takes.
    assert_type(await runner.start_service(cache, 10, name="cache"), str)
    assert_type(await runner.start_service(ready), None)
    assert_type(await runner.start_service(pair, 1, "a", 2.0), tuple[int, str])
    # Not Any: a wrong use of the result, or a wrong argument, is an error.
    (await runner.start_service(cache, 10)).bit_length()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue]
    await runner.start_service(cache, "ten")  # type: ignore[misc]  # pyright: ignore[reportArgumentType]
    await runner.lifecycle.wait_state(LifecycleState.READY)
    runner.request_shutdown("done")
    async with open_stdin_lines() as lines:
        assert_type(lines, StdinLines)
        assert_type(await lines.receive(), bytes)
        async for line in lines:
            assert_type(line, bytes)
    task_status.started()


async def plain(count: int) -> None: ...


def entry_points() -> None:
    assert_type(run(plain, 3), int)
    assert_type(run(main, "db.sqlite", grace=5, exit_codes=ExitCodes(error=2)), int)
    run(plain, "three")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    run(plain, 3, second_signal="later")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]


def command_line(parser: argparse.ArgumentParser) -> int:
    # run()'s defaults come from its options class; its keywords stay typed.
    add_run_arguments(parser, grace=30)
    options = run_arguments(parser.parse_args([]))
    assert_type(options, RunArguments)
    assert_type(options["grace"], float)
    assert_type(options["health_port"], "int | None")
    return run(plain, 3, **options)
