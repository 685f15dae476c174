"""The task tree the emergency exit prints: names, await frames, the running task."""

from __future__ import annotations

import time
from typing import Any

import trio
import trio.testing

from trio_graceful import open_bundle
from trio_graceful._run._exit._tasktree import format_task_tree


async def parked_forever() -> None:
    await trio.sleep_forever()


async def waits_on_an_event(event: trio.Event) -> None:
    await event.wait()


def frame_line(fn: Any, offset: int) -> str:
    code = fn.__code__
    return f"{code.co_filename}:{code.co_firstlineno + offset} in {code.co_name}"


def format_when_suspended(root: trio.lowlevel.Task) -> str:
    while getattr(root.coro, "cr_running", False):
        time.sleep(0.001)
    return format_task_tree(root)


async def test_every_task_with_where_it_waits():
    event = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(parked_forever, name="parked")
        async with open_bundle(name="workers") as bundle:
            bundle.start_soon(waits_on_an_event, event, name="waiter")
            await trio.testing.wait_all_tasks_blocked()
            root = trio.lowlevel.current_task()
            # From another thread, as the watchdog does, once this task has
            # suspended (the thread may start before it has).
            text = await trio.to_thread.run_sync(format_when_suspended, root)
            event.set()
        nursery.cancel_scope.cancel()
    lines = text.splitlines()
    assert lines[0] == root.name
    parked = lines.index("  parked")
    assert lines[parked + 1] == "      " + frame_line(parked_forever, 1)
    assert lines[parked + 2].endswith("trio/_timeouts.py:71 in sleep_forever")
    # A bundle's children hang from the small task that hosts its nursery.
    host = lines.index("  <host of bundle 'workers'>")
    waiter = lines.index("    waiter")
    assert waiter > host
    assert (
        "        " + frame_line(waits_on_an_event, 1) in lines[waiter + 1 : waiter + 4]
    )
    # The scheduler's own frames are left out.
    assert "/trio/_core/" not in text


async def test_the_running_task_is_marked():
    root = trio.lowlevel.current_task()
    text = format_task_tree(root)
    assert text.splitlines()[0] == f"{root.name}  (running now)"


class ChangingTask:
    """Stands for a task whose children change under the reader every time."""

    name = "changing"
    coro = None

    def iter_await_frames(self) -> Any:
        return iter(())

    @property
    def child_nurseries(self) -> list[Any]:
        raise RuntimeError("Set changed size during iteration")


def test_a_tree_that_keeps_changing_is_reported_not_raised():
    text = format_task_tree(ChangingTask())  # type: ignore[arg-type]
    assert text == (
        "(the task tree kept changing while being read: "
        "RuntimeError('Set changed size during iteration'))\n"
    )
