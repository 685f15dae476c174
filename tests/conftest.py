from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from trio_graceful._run._exit import _guard

# The PostgreSQL server of the job store tests, for tests/jobs and tests/examples.
pytest_plugins = ["tests.support.postgres"]

# Deterministic by default: the same examples on every run and every machine.
# HYPOTHESIS_PROFILE=explore searches afresh (use it when changing the core).
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    max_examples=150,
)
settings.register_profile(
    "explore",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    max_examples=2000,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# What SIGINT was when the session began: put back after every test.
_SESSION_SIGINT = signal.getsignal(signal.SIGINT)


@pytest.fixture(autouse=True)
def shutdown_signals_as_python_sets_them() -> Iterator[None]:
    """Start every test with SIGINT as Python sets it, and give SIGTERM back after.

    A test run started in the background by a non-interactive shell (``pytest
    &`` in a script) has SIGINT ignored, and its children inherit that; a
    program run by trio_graceful.run then rightly keeps SIGINT ignored, and a
    test that sends it SIGINT would wait in vain. A handler that an earlier
    test left behind (a Trio `KeyboardInterrupt` handler of a run that has
    ended was seen once, after the notebooks' Jupyter client) would keep Trio
    from installing its own in the next `trio.run`. And a run that took a
    signal keeps its handlers until the process exits (a later signal must
    not end a program on its way out); in the test process, which goes on,
    the next test must not inherit them.
    """
    sigterm = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, _SESSION_SIGINT)
        signal.signal(signal.SIGTERM, sigterm)


class ProcessEnds:
    """The statuses the exit guard would have ended the test process with."""

    def __init__(self) -> None:
        self.statuses: list[int] = []
        self._ended = threading.Event()
        self.checked = False

    def end(self, status: int) -> None:
        self.statuses.append(status)
        self._ended.set()

    def wait(self) -> list[int]:
        """Wait until the guard has ended the process; return the statuses."""
        assert self._ended.wait(60), "the exit guard did not end the process"
        self.checked = True
        return self.statuses


@pytest.fixture(autouse=True)
def process_ends(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProcessEnds]:
    """Keep the exit guard from ending the test process; stand it down after.

    A run that took a signal arms the process's exit guard, which ends the
    process at the next signal or, once its exit has begun, at the end of
    the stop time. The test process goes on: here the guard only records
    the status it would have ended it with, and a test that expects an end
    waits for it; one that did not is failed.
    """
    guard = _guard.exit_guard()
    ends = ProcessEnds()
    monkeypatch.setattr(guard, "_end", ends.end)
    try:
        yield ends
    finally:
        guard.stand_down()
        # A signal of this test still on its way to the guard's thread would
        # be passed on from there, idle now, to whatever handler the next
        # test has: SIGTERM's default would end the test process.
        with guard._lock:  # pyright: ignore[reportPrivateUsage]
            if guard._read_fd != -1:  # pyright: ignore[reportPrivateUsage]
                guard._read_pipe()  # pyright: ignore[reportPrivateUsage]
    assert ends.checked or not ends.statuses, (
        f"the exit guard would have ended the process with {ends.statuses}"
    )
