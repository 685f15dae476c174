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
