"""Helpers shared by the job tests: stores under the mock clock."""

from __future__ import annotations

import trio

from trio_graceful.jobs import JobStore, open_store


def mock_store(path: str = ":memory:") -> JobStore:
    """A store whose clock is Trio's and whose queries run in the Trio thread."""
    return open_store(f"sqlite:///{path}", clock=trio.current_time, offload=False)
