"""Lifecycles for tests: made without a run, and walked to any state."""

from __future__ import annotations

from collections import deque

from trio_graceful import Lifecycle, LifecycleState
from trio_graceful._run._program._lifecycle import (
    INITIAL_STATE,
    TRANSITIONS,
    LifecycleEvent,
)


def new_lifecycle(name: str = "svc") -> Lifecycle:
    return Lifecycle._create(name)


def path_to(state: LifecycleState) -> list[LifecycleEvent]:
    """The shortest sequence of events from the initial state to ``state``."""
    paths: dict[LifecycleState, list[LifecycleEvent]] = {INITIAL_STATE: []}
    todo = deque([INITIAL_STATE])
    while todo:
        source = todo.popleft()
        for (from_state, event), target in TRANSITIONS.items():
            if from_state is source and target not in paths:
                paths[target] = [*paths[source], event]
                todo.append(target)
    return paths[state]


def lifecycle_in(state: LifecycleState) -> Lifecycle:
    lifecycle = new_lifecycle()
    for event in path_to(state):
        lifecycle._transition(event, f"on the way to {state.value}")
    assert lifecycle.state is state
    return lifecycle
