"""A real PostgreSQL server for the tests of job stores, started once per session.

It runs from a temporary directory with its socket there (no TCP port), as
the ``postgres`` system user when the tests run as root (the server refuses
to run as root). Without the server's programs or psycopg, the tests that
need it are skipped with a message saying how to install them.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator

import pytest

INSTALL = (
    "PostgreSQL is not installed: apt-get install -y postgresql "
    "(and pip install -e '.[postgres]') to run these tests"
)


def _bin_dir() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


def _as_server_user(args: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *args]
    return args


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The connection URL of the server's ``postgres`` database."""
    bin_dir = _bin_dir()
    if bin_dir is None or importlib.util.find_spec("psycopg") is None:
        pytest.skip(INSTALL)
    home = tempfile.mkdtemp(prefix="trio-graceful-pg-")
    data = os.path.join(home, "data")
    if os.geteuid() == 0:
        shutil.chown(home, "postgres")
    subprocess.run(
        _as_server_user(
            [f"{bin_dir}/initdb", "-D", data, "-A", "trust", "-U", "postgres"]
        ),
        check=True,
        capture_output=True,
    )
    subprocess.run(
        _as_server_user(
            [
                f"{bin_dir}/pg_ctl",
                "-D",
                data,
                "-w",
                "-l",
                os.path.join(home, "log"),
                "-o",
                f"-k {home} -c listen_addresses='' -c fsync=off",
                "start",
            ]
        ),
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://postgres@/postgres?host={home}"
    finally:
        subprocess.run(
            _as_server_user(
                [f"{bin_dir}/pg_ctl", "-D", data, "-m", "immediate", "stop"]
            ),
            check=False,
            capture_output=True,
        )
        shutil.rmtree(home, ignore_errors=True)


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
