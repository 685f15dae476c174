"""Watching Trio's scheduler: how often each task is stepped."""

from __future__ import annotations

import trio


class StepCounter(trio.abc.Instrument):
    """Counts how often each task is stepped by the scheduler."""

    def __init__(self) -> None:
        self.steps: dict[trio.lowlevel.Task, int] = {}

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps[task] = self.steps.get(task, 0) + 1
