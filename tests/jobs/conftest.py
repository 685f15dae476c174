"""The job tests' own fixtures; the PostgreSQL server is in tests/postgres_fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import jobs as support


@pytest.fixture(autouse=True)
def close_mock_stores() -> Iterator[None]:
    """Close the stores a test made with `support.mock_store`."""
    yield
    while support.opened:
        support.opened.pop().close()
