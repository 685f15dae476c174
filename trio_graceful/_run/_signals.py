"""Shutdown signals, from the process's handlers to the run, each counted once.

`SignalRelay` installs a Python-level handler for each shutdown signal before
`trio.run` and restores the previous one after it. While the run is live the
handler passes each signal to the Trio thread with
`trio.lowlevel.TrioToken.run_sync_soon`, as Trio's own signal receiver does,
but one call per signal (Trio's receiver merges repeats, and escalation must
count them). Before the run is connected the handler keeps the signals for it;
after it is disconnected it keeps them for a log line.

A signal that the process ignores (``SIG_IGN``) when `run` starts stays
ignored, as CPython leaves an inherited ignored SIGINT alone: a program
started as ``prog &`` by a non-interactive shell is not meant to be stopped
by the terminal's Ctrl+C.

The handlers also keep Trio from installing its `KeyboardInterrupt` handler.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Generator
from types import FrameType
from typing import Any, final


@final
class SignalRelay:
    """The run's shutdown signals, from the handler to a callback in the run.

    Args:
        signals: The shutdown signals asked for; those the process ignores
            are left ignored and not handled.
    """

    def __init__(self, signals: tuple[int, ...]) -> None:
        self.ignored = tuple(
            s for s in signals if signal.getsignal(s) is signal.SIG_IGN
        )
        """The signals left ignored because the process ignored them."""
        self.handled = tuple(s for s in signals if s not in self.ignored)
        """The signals handled."""
        self._deliver: Callable[[int], object] | None = None
        self._kept: list[int] = []

    @contextlib.contextmanager
    def installed(self) -> Generator[None, None, None]:
        """Install the handlers while the block runs (in the main thread)."""
        previous: dict[int, Any] = {}
        try:
            for signum in self.handled:
                previous[signum] = signal.signal(signum, self._handle)
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def connect(self, deliver: Callable[[int], object]) -> list[int]:
        """Pass further signals to ``deliver``; return those that came before.

        ``deliver`` is called in the signal handler: it must be safe there,
        like ``token.run_sync_soon(fn, signum)``.
        """
        self._deliver = deliver
        kept, self._kept = self._kept, []
        return kept

    def disconnect(self) -> None:
        """Keep further signals instead of passing them on."""
        self._deliver = None

    def take_kept(self) -> list[int]:
        """The signals kept since the last `connect` or `take_kept`."""
        kept, self._kept = self._kept, []
        return kept

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        deliver = self._deliver
        if deliver is None:
            self._kept.append(signum)
        else:
            deliver(signum)
