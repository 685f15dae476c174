"""The pieces of trio_graceful.workers that need no process: sockets,
the environment, the arguments and a worker's table of states."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

import trio_graceful
from trio_graceful.workers import (
    WorkerState,
    inherited_binds,
    inherited_sockets,
    open_listeners,
    serve_workers,
    systemd_listeners,
)
from trio_graceful.workers._process import TRANSITIONS, Worker, _Event


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
