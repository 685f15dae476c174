"""The pieces of trio_graceful.workers that need no process: sockets,
the environment, the arguments and a worker's table of states."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

import trio_graceful
from trio_graceful.workers import (
    WorkerState,
    close_listeners,
    inherited_binds,
    inherited_sockets,
    open_listeners,
    serve_workers,
    systemd_listeners,
)
from trio_graceful.workers._workerprocess import TRANSITIONS, Worker, _Event


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    [sock] = open_listeners(["127.0.0.1:0"])
    with sock:
        yield sock


def test_open_listeners_binds_listens_and_keeps_its_sockets_from_children(
    listening: socket.socket,
):
    assert listening.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
    assert not listening.get_inheritable()
    with socket.create_connection(listening.getsockname()):
        pass


def test_open_listeners_names_the_address_it_cannot_bind(listening: socket.socket):
    host, port = listening.getsockname()
    with pytest.raises(
        OSError, match=rf"^\[Errno 98\] cannot listen on {host}:{port}:"
    ):
        open_listeners(["127.0.0.1:0", f"{host}:{port}"])


@pytest.mark.parametrize("binds", [[], "127.0.0.1:80", ["8000"], ["host:port"]])
def test_open_listeners_refuses_what_is_no_address(binds: object):
    with pytest.raises(ValueError, match=r"^(binds must|an address must)"):
        open_listeners(binds)  # type: ignore[arg-type]


def test_systemd_listeners_takes_the_sockets_meant_for_this_process(
    listening: socket.socket,
):
    environ = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "0", "OTHER": "x"}
    assert systemd_listeners(environ) == []
    assert environ == {"OTHER": "x"}  # none left for a child to take
    environ = {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1"}
    assert systemd_listeners(environ, unset_environment=False) == []
    assert environ["LISTEN_FDS"] == "1"
    with pytest.raises(ValueError, match=r"^LISTEN_FDS must be a number of sockets"):
        systemd_listeners({"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "x"})


def test_a_worker_finds_its_inherited_sockets(listening: socket.socket):
    environ = {"TRIO_GRACEFUL_WORKER_FDS": str(listening.fileno())}
    assert inherited_binds(environ) == [f"fd://{listening.fileno()}"]
    [again] = inherited_sockets(environ)
    assert again.getsockname() == listening.getsockname()
    again.detach()  # the fixture's socket is the same descriptor
    with pytest.raises(LookupError, match=r"TRIO_GRACEFUL_WORKER_FDS is not set"):
        inherited_sockets({})
    with pytest.raises(ValueError, match=r"must list descriptors, not 'x'$"):
        inherited_binds({"TRIO_GRACEFUL_WORKER_FDS": "x"})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"workers": 0}, r"^workers must be >= 1, not 0$"),
        ({"max_restarts": -1}, r"^max_restarts must be >= 0, not -1$"),
        ({"ready_timeout": -1.0}, r"^ready_timeout must be >= 0, not -1.0$"),
        ({"grace": float("nan")}, r"^grace must be >= 0, not nan$"),
        ({"sockets": []}, r"^sockets must hold at least one listening socket$"),
    ],
)
async def test_serve_workers_checks_its_arguments_before_anything_starts(
    listening: socket.socket, options: dict[str, object], message: str
):
    arguments: dict[str, object] = {"sockets": [listening], **options}
    async with trio_graceful.open_bundle() as bundle:
        _, inbox = bundle.open_inbox()
        with pytest.raises(ValueError, match=message):
            await serve_workers(inbox, ["true"], **arguments)  # type: ignore[arg-type]


def test_a_worker_moves_only_along_its_table():
    worker = Worker(1, 0, member=True)
    assert worker.state is WorkerState.STARTING
    assert {target for _, target in TRANSITIONS.items()} == set(WorkerState) - {
        WorkerState.STARTING
    }
    worker.request_stop(5.0, "test")
    assert worker.state is WorkerState.STOPPING
    worker.state = WorkerState.EXITED
    worker.request_stop(5.0, "test")  # a stop after the end changes nothing
    assert worker.state is WorkerState.EXITED
    with pytest.raises(
        trio_graceful.IllegalTransitionError,
        match=r"^worker 1 cannot become ready while exited; that is legal only "
        r"while starting or ready or stopping$",
    ):
        worker._move(_Event.BECOME_READY)
    assert worker.state is WorkerState.EXITED


def test_close_listeners_removes_the_file_of_a_unix_socket(tmp_path: Path):
    path = tmp_path / "socket"
    [sock] = open_listeners([f"unix:{path}"])
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(str(path))
    close_listeners([sock])
    assert sock.fileno() == -1
    assert not path.exists()
    close_listeners([sock])  # again: nothing more to do


def test_close_listeners_leaves_a_file_that_is_no_longer_its_own(tmp_path: Path):
    path = tmp_path / "socket"
    [sock] = open_listeners([f"unix:{path}"])
    path.unlink()
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(str(path))  # another service bound the path since
        close_listeners([sock])
        assert path.exists()


def test_close_listeners_leaves_the_files_of_sockets_it_did_not_bind(tmp_path: Path):
    path = tmp_path / "socket"
    given = socket.socket(socket.AF_UNIX)  # as systemd would pass it
    given.bind(str(path))
    given.listen()
    close_listeners([given])
    assert given.fileno() == -1
    assert path.exists()


def test_open_listeners_replaces_a_stale_unix_socket_file(tmp_path: Path):
    path = tmp_path / "socket"
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(path))  # and closed without removing its file
    [sock] = open_listeners([f"unix:{path}"])
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(str(path))
    close_listeners([sock])
    assert not path.exists()


@pytest.mark.parametrize("backlog", [8, 0])
def test_open_listeners_refuses_a_unix_path_somebody_listens_on(
    tmp_path: Path, backlog: int
):
    path = tmp_path / "socket"
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(str(path))
        live.listen(backlog)
        if backlog == 0:  # a queue that is full: connecting would wait
            filler = socket.socket(socket.AF_UNIX)
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(str(path))
        with pytest.raises(
            OSError,
            match=rf"^\[Errno 98\] cannot listen on unix:{path}: another process "
            r"listens there$",
        ):
            open_listeners(["127.0.0.1:0", f"unix:{path}"])
        if backlog == 0:
            filler.close()
        assert path.exists()  # the live one's file is left alone


def test_open_listeners_refuses_a_unix_path_that_is_no_socket(tmp_path: Path):
    path = tmp_path / "socket"
    path.write_text("data")
    with pytest.raises(
        OSError,
        match=rf"^\[Errno 98\] cannot listen on unix:{path}: the path exists and "
        r"is not a socket$",
    ):
        open_listeners([f"unix:{path}"])
    assert path.read_text() == "data"
