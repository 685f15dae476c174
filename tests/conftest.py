from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

# The PostgreSQL server of the job store tests, for tests/jobs and tests/examples.
pytest_plugins = ["tests.postgres_fixtures"]

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


@pytest.fixture(autouse=True)
def sigint_not_ignored() -> Iterator[None]:
    """Let the programs a test starts inherit SIGINT as Python would have it.

    A test run started in the background by a non-interactive shell (``pytest
    &`` in a script) has SIGINT ignored, and its children inherit that; a
    program run by trio_graceful.run then rightly keeps SIGINT ignored, and a
    test that sends it SIGINT would wait in vain.
    """
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if previous is signal.SIG_IGN:
            signal.signal(signal.SIGINT, previous)


@pytest.fixture(autouse=True)
def shutdown_signals_given_back() -> Iterator[None]:
    """Give each test the handlers of SIGINT and SIGTERM it found.

    A run that took a signal keeps its handlers until the process exits (a
    later signal must not end a program on its way out); in the test process,
    which goes on, the next test must not inherit them.
    """
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)
