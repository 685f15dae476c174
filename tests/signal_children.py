"""A fixture for tests that send SIGINT to the programs they start.

A test run started in the background by a non-interactive shell (``pytest &``
in a script) has SIGINT ignored, and its children inherit that; a program run
by trio_graceful.run then rightly leaves SIGINT ignored, and a test that
sends it SIGINT waits in vain. Give such tests' children SIGINT as Python
would have it.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest


@pytest.fixture
def sigint_not_ignored() -> Iterator[None]:
    """Make the children started during the test inherit SIGINT not ignored."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if previous is signal.SIG_IGN:
            signal.signal(signal.SIGINT, previous)
