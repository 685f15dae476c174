"""Shutdown signals, from the process's handlers to the run, each counted once.

`SignalRelay` installs a Python-level handler for each shutdown signal before
`trio.run`. While the run is live the handler passes each signal to the Trio
thread with `trio.lowlevel.TrioToken.run_sync_soon`, as Trio's own signal
receiver does, but one call per signal (Trio's receiver merges repeats, and
escalation must count them). Before the run is connected the handler keeps
the signals for it; after it is disconnected it keeps them for what comes
after the run (see below).

A signal that the process ignores (``SIG_IGN``) when `run` starts stays
ignored, as CPython leaves an inherited ignored SIGINT alone: a program
started as ``prog &`` by a non-interactive shell is not meant to be stopped
by the terminal's Ctrl+C. The run says so at startup (`ignored_warning`), so
that nobody waits for a Ctrl+C that cannot work.

The handlers also keep Trio from installing its `KeyboardInterrupt` handler.

Once the run has taken a signal, the process is on its way out, and no later
signal may end it otherwise than the log says: not by the default action of
SIGTERM, nor by a `KeyboardInterrupt` in whatever runs after `run`. So the
handlers of such a run do not simply give way to the previous ones when it
returns: they are handed, with the signals that came too late for the run,
to whoever the run names (the exit guard of ``_exit._guard``, which ends the
process at the next signal, and gives the previous handlers back to a
program that goes on past its stop time). A run that took no signal gives
the previous handlers back.

Handlers change only while the main thread blocks the signals (the watchdog
thread blocks them for good): CPython runs whatever handler is current when
it gets to a signal that arrived under the previous one, which would be
`signal.default_int_handler` (a traceback), or, for ``SIG_IGN``, a line
"Signal 2 ignored due to race condition" on stderr. A blocked signal waits,
and the kernel drops it when its handler becomes ``SIG_IGN``.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Collection, Generator, Mapping
from types import FrameType
from typing import Any, final

from ..._core._lowlevel import signal_name

Keep = Callable[[Mapping[int, Any], list[int]], object]
"""Takes the signals of a run that took one: the previous handlers, the late signals."""


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
        self._took_signal = False
        # One object, so that the exit can tell whether it is still installed.
        self._handler = self._handle

    @contextlib.contextmanager
    def installed(self, keep: Keep) -> Generator[None, None, None]:
        """Install the handlers while the block runs (in the main thread).

        On the way out the previous handlers come back, unless a signal
        came: then ``keep(previous, late)`` takes the signals over, with the
        previous handlers and the signals kept since the run was
        disconnected, while the main thread blocks them (see the module
        docstring).
        """
        previous: dict[int, Any] = {}
        try:
            for signum in self.handled:
                previous[signum] = signal.signal(signum, self._handler)
            yield
        finally:
            if previous:
                self._restore(previous, keep)

    def _restore(self, previous: dict[int, Any], keep: Keep) -> None:
        self._deliver = None  # the run is over, whatever ended it
        with blocked(previous):
            # What had arrived has been handled (CPython runs handlers at
            # the next call); what arrives from now on waits: both count.
            if self._took_signal or not signal.sigpending().isdisjoint(previous):
                late, self._kept = self._kept, []
                keep(previous, late)
            else:
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

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._took_signal = True
        deliver = self._deliver
        if deliver is None:
            self._kept.append(signum)
        else:
            deliver(signum)


def ignored_warning(signum: int) -> str:
    """Say that ``signum`` came ignored from the parent, and stays ignored."""
    name = signal_name(signum)
    sigint = signum == signal.SIGINT
    why = " (as for 'prog &' in a script)" if sigint else ""
    return (
        f"{name} was ignored by the parent process{why}: "
        f"{'Ctrl+C' if sigint else name} will not stop this program, since "
        f"the run leaves {name} ignored, as Python does; install a handler "
        "for it before run() to handle it"
    )


@contextlib.contextmanager
def blocked(signals: Collection[int]) -> Generator[None, None, None]:
    """Hold ``signals`` back from this thread while the block runs.

    Those that arrive meanwhile wait until the block ends (or are dropped,
    if their handler is then ``SIG_IGN``), unless another thread that does
    not block them takes them.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
