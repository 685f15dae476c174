"""Signal escalation: what the n-th shutdown signal does, counted once for a run.

Two observers see every shutdown signal of a run: the Trio thread (through
the Python-level handler) and the watchdog thread (through the signal wakeup
fd, which works while the Trio thread is stuck). Each keeps its own count, and
the run's *level* is the larger of the two: never the sum (one signal seen
twice is still one signal), and never behind either observer (the Trio thread
may handle a signal before the watchdog reads its byte, or the watchdog may
see two bytes of signals that CPython delivered to Python as one call).

What each level means is one table, `ESCALATION`, shared by the runner and
the watchdog; each of them does its own part of a step (`Step`) and asks
`Escalation.record` which steps it has not yet done. A signal that arrives
before either observer is ready is recorded by both (`record_early`).
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Literal, final

SecondSignal = Literal["force", "exit"]


class Step(enum.Enum):
    """What reaching a level of escalation does.

    * ``SHUT_DOWN``: the graceful shutdown begins (the runner), and the
      watchdog allows it the grace plus the unwind budget.
    * ``FORCE``: everything is hard-cancelled (the runner), and the watchdog
      allows the unwind budget.
    * ``EXIT_NOW``: the watchdog ends the process at once with the status of
      a forced shutdown (``second_signal="exit"``).
    * ``EMERGENCY``: the watchdog ends the process with `ExitCodes.emergency`
      and the report of what was still running.
    """

    SHUT_DOWN = "shut down"
    FORCE = "force"
    EXIT_NOW = "exit now"
    EMERGENCY = "emergency"


ESCALATION: Final[Mapping[SecondSignal, tuple[Step, ...]]] = MappingProxyType(
    {
        "force": (Step.SHUT_DOWN, Step.FORCE, Step.EMERGENCY),
        "exit": (Step.SHUT_DOWN, Step.EXIT_NOW),
    }
)
"""For each ``second_signal`` mode, the step of the 1st, 2nd, ... signal.

Signals past the end of a row do nothing more (the process is ending).
"""


class Observer(enum.Enum):
    """Who saw a signal."""

    TRIO = "trio"
    WATCHDOG = "watchdog"


@final
class Escalation:
    """The signal count of one run, shared by the Trio thread and the watchdog.

    Thread-safe. Never call it from a signal handler: the handler may run in
    the main thread while that thread holds the lock.
    """

    def __init__(self, second_signal: SecondSignal) -> None:
        self._steps = ESCALATION[second_signal]
        self._lock = threading.Lock()
        self._seen = dict.fromkeys(Observer, 0)
        self._done = dict.fromkeys(Observer, 0)
        self._first_signal: int | None = None
        self._first_signal_at: float | None = None
        self._last_signal: int | None = None

    @property
    def last_signal(self) -> int | None:
        """The latest signal recorded; None before any."""
        return self._last_signal

    @property
    def first_signal(self) -> int | None:
        """The signal that began the escalation; None before any."""
        return self._first_signal

    @property
    def first_signal_at(self) -> float | None:
        """When the first signal was recorded (`time.monotonic`); None before any."""
        return self._first_signal_at

    @property
    def level(self) -> int:
        """How many shutdown signals the run has received."""
        with self._lock:
            return max(self._seen.values())

    def record(self, observer: Observer, signum: int) -> tuple[Step, ...]:
        """Count ``signum`` as seen by ``observer``; return the steps it must now do."""
        with self._lock:
            self._seen[observer] += 1
            return self._take(observer, signum)

    def record_early(self, signum: int) -> None:
        """Count a signal that came before the observers were ready, for both."""
        with self._lock:
            for observer in Observer:
                self._seen[observer] += 1
            self._last_signal = signum
            self._note_first(signum)

    def catch_up(self, observer: Observer) -> tuple[Step, ...]:
        """The steps ``observer`` has not done for signals the other one saw."""
        with self._lock:
            return self._take(observer, None)

    def behind(self, observer: Observer) -> bool:
        """Whether ``observer`` has steps left to do."""
        with self._lock:
            return self._done[observer] < self._level()

    def _note_first(self, signum: int) -> None:
        if self._first_signal is None:
            self._first_signal = signum
            self._first_signal_at = time.monotonic()

    def _level(self) -> int:
        return min(max(self._seen.values()), len(self._steps))

    def _take(self, observer: Observer, signum: int | None) -> tuple[Step, ...]:
        if signum is not None:
            self._last_signal = signum
            self._note_first(signum)
        level = self._level()
        done = self._done[observer]
        if level <= done:
            return ()
        self._done[observer] = level
        return self._steps[done:level]
