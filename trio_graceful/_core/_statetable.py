"""What every transition table of the package answers: legal sources, reachability.

The state machines (a program's lifecycle, the runner's stages, an inbox's
STOP position, a job's state) are each one table, ``(state, event) -> next
state``, in a module of their own. The questions asked of the tables are the
same everywhere and are answered here once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

S = TypeVar("S")
E = TypeVar("E")


def legal_sources(
    table: Mapping[tuple[S, E], S], states: Iterable[S], event: E
) -> tuple[S, ...]:
    """The states in which ``event`` is legal, in the order of ``states``."""
    return tuple(state for state in states if (state, event) in table)


def reachable(table: Mapping[tuple[S, E], S], starts: Iterable[S]) -> frozenset[S]:
    """The states that one transition or more lead to from any of ``starts``.

    A start is in the result only if a cycle leads back to it.
    """
    seen: set[S] = set()
    todo = list(starts)
    while todo:
        state = todo.pop()
        for (source, _), target in table.items():
            if source == state and target not in seen:
                seen.add(target)
                todo.append(target)
    return frozenset(seen)


def describe_sources(sources: Iterable[object]) -> str:
    """``"ready or degraded"``: the values of enum members, for messages."""
    return " or ".join(str(getattr(source, "value", source)) for source in sources)
