"""One shape for every state machine of the package: a table of transitions.

Each machine (a program's lifecycle, the runner's stages, an inbox's STOP
position, a bundle's phase, a job's state, the exit guard) is one
`StateTable`: ``(state, event) -> next state``, declared as data in the
module that owns the machine. The table answers the questions asked of
every machine (where does this event lead, where is it legal, what can
still be reached) and raises the one error of the package for a move it
does not allow, `IllegalTransitionError`, before anything changes.

A machine that needs an error of its own (a job's, which callers catch by
that name) passes a subclass; catching the base catches them all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Generic, TypeVar, final

import attrs

S = TypeVar("S")
E = TypeVar("E")


class IllegalTransitionError(RuntimeError):
    """An event that a state machine's table does not allow in its state now.

    Nothing changed: the machine is in the state it was in before the event.
    Each machine's own error (`~trio_graceful.jobs.IllegalJobTransitionError`,
    for one) is a subclass.
    """


def _word(value: object) -> str:
    # The value of an enum member ("shutting down"), or the thing itself.
    return str(getattr(value, "value", value))


@final
@attrs.frozen(eq=False)
class StateTable(Generic[S, E]):
    """The transitions of one state machine, and the questions asked of them.

    Args:
        transitions: ``(state, event) -> next state``; a pair that is not a
            key is a move the machine refuses.
        states: Every state, in declaration order (an `enum.Enum` class
            will do): the order in which messages list legal states.
        error: The exception raised for a refused move.
    """

    transitions: Mapping[tuple[S, E], S]
    states: Iterable[S]
    error: type[IllegalTransitionError] = IllegalTransitionError

    def move(self, state: S, event: E, *, subject: str) -> S:
        """Return the state that ``event`` leads to from ``state``.

        Args:
            state: The machine's state now.
            event: What happens.
            subject: Who moves, for the message (``"job 7"``, ``"STOP"``).

        Raises:
            IllegalTransitionError: (``error``) if the pair is not in the
                table: ``job 7 cannot claim while done; that is legal only
                while queued``.
        """
        try:
            return self.transitions[state, event]
        except KeyError:
            raise self.error(self.refusal(state, event, subject=subject)) from None

    def refusal(self, state: S, event: E, *, subject: str) -> str:
        """The message for a refused move: what, while what, and where it is legal."""
        legal = self.legal_sources(event)
        where = (
            f"that is legal only while {' or '.join(map(_word, legal))}"
            if legal
            else "that is never legal"
        )
        return f"{subject} cannot {_word(event)} while {_word(state)}; {where}"

    def legal_sources(self, event: E) -> tuple[S, ...]:
        """The states in which ``event`` is legal, in the order of `states`."""
        return tuple(
            state for state in self.states if (state, event) in self.transitions
        )

    def reachable(self, starts: Iterable[S]) -> frozenset[S]:
        """The states that one transition or more lead to from any of ``starts``.

        A start is in the result only if a cycle leads back to it.
        """
        seen: set[S] = set()
        todo = list(starts)
        while todo:
            state = todo.pop()
            for (source, _), target in self.transitions.items():
                if source == state and target not in seen:
                    seen.add(target)
                    todo.append(target)
        return frozenset(seen)

    def left(self) -> frozenset[S]:
        """The states some event leads out of: every state that is not final."""
        return frozenset(source for source, _ in self.transitions)
