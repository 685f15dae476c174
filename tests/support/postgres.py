"""A real PostgreSQL server for the tests of job stores, started once per session.

It runs from a temporary directory with its socket there (no TCP port), as
the ``postgres`` system user when the tests run as root (the server refuses
to run as root). Without the server's programs or psycopg, the tests that
need it are skipped with a message saying how to install them.
"""

from __future__ import annotations

import importlib.util
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# The bench's server, started the same way (bench/ is scripts, not a package).
BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if BENCH not in sys.path:
    sys.path.append(BENCH)
import _postgres  # noqa: E402
from _postgres import as_server_user as as_server_user, bin_dir  # noqa: E402

INSTALL = (
    "PostgreSQL is not installed: apt-get install -y postgresql "
    "(and pip install -e '.[postgres]') to run these tests"
)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The connection URL of the server's ``postgres`` database."""
    if bin_dir() is None or importlib.util.find_spec("psycopg") is None:
        pytest.skip(INSTALL)
    # fsync off: what is tested is what the server says, not the disk.
    with _postgres.started_server(settings="-c fsync=off", stop="immediate") as url:
        yield url


@pytest.fixture
def postgres_url(postgres_server: str) -> str:
    """A fresh, empty database on the test server."""
    import psycopg
    from psycopg import sql

    name = f"jobs_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return postgres_server.replace("/postgres?", f"/{name}?")


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: object) -> str:
    """The URL of an empty store of each kind."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/jobs.db"
    return str(request.getfixturevalue("postgres_url"))
