"""A PostgreSQL server of the bench's own: started, given databases, stopped.

From a temporary directory with its socket there and no TCP port, as the
``postgres`` system user when run as root (the server refuses root). The
bench keeps ``fsync`` on, PostgreSQL's default, since what a durable job
costs is what is measured; the tests start theirs here too
(``tests/support/postgres.py``), with ``fsync`` off.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import urllib.parse
from collections.abc import Iterator


def bin_dir() -> str | None:
    """Where initdb and pg_ctl are, or None if PostgreSQL is not installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


def as_server_user(args: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *args]
    return args


@contextlib.contextmanager
def started_server(*, settings: str = "", stop: str = "fast") -> Iterator[str]:
    """Start a server; yield the URL of its ``postgres`` database; stop it.

    ``settings``: more ``-c name=value`` options for the server; ``stop``:
    the ``pg_ctl stop`` mode.
    """
    where = bin_dir()
    if where is None:
        raise SystemExit("PostgreSQL is not installed: apt-get install -y postgresql")
    home = tempfile.mkdtemp(prefix="trio-graceful-pg-")
    data = os.path.join(home, "data")
    if os.geteuid() == 0:
        shutil.chown(home, "postgres")
    subprocess.run(
        as_server_user(
            [f"{where}/initdb", "-D", data, "-A", "trust", "-U", "postgres"]
        ),
        check=True,
        capture_output=True,
    )
    options = f"-k {home} -c listen_addresses='' -c max_connections=200 {settings}"
    subprocess.run(
        as_server_user(
            [
                *(f"{where}/pg_ctl", "-D", data, "-w"),
                *("-l", os.path.join(home, "log"), "-o", options, "start"),
            ]
        ),
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://postgres@/postgres?host={home}"
    finally:
        subprocess.run(
            as_server_user([f"{where}/pg_ctl", "-D", data, "-m", stop, "stop"]),
            check=False,
            capture_output=True,
        )
        shutil.rmtree(home, ignore_errors=True)


def create_database(admin_url: str, name: str) -> str:
    """Create an empty database ``name`` (dropped first if it exists); its URL."""
    # Here, not at the top: the tests start their server without psycopg.
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)
            )
        )
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return database_url(admin_url, name)


def database_url(url: str, name: str) -> str:
    """``url`` with its database replaced by ``name``."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))
