"""Listening sockets shared by workers: opened once, inherited by every worker.

The supervisor opens its listening sockets once (`open_listeners`), or takes
them from systemd's socket activation (`systemd_listeners`), and keeps them
open for as long as the service runs: a worker that stops, crashes or is
replaced closes its own descriptor of the socket, never the socket, so its
accept queue outlives every worker and no connection is refused.

A worker gets the same sockets as inherited file descriptors, named in
``$TRIO_GRACEFUL_WORKER_FDS`` (`inherited_sockets`, `inherited_binds`).
systemd's own variables cannot be used for that: ``$LISTEN_PID`` must be the
worker's process id, which is only known once the worker runs.

A ``unix:PATH`` socket is a file, which outlives the socket: `close_listeners`
removes the files `open_listeners` made, if they are still the same files
(another service may have bound the path since), and `open_listeners`
replaces a file left by a process that died without removing it, once a
connection to it is refused: nobody listens there. A file on which somebody
listens is never taken over. Sockets from systemd are systemd's: their files
are left alone.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from collections.abc import Iterable, MutableMapping, Sequence
from typing import Final, cast

FDS_VARIABLE: Final = "TRIO_GRACEFUL_WORKER_FDS"
"""The variable naming a worker's inherited sockets: descriptors, comma-separated."""

SYSTEMD_VARIABLES: Final = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")
_SD_LISTEN_FDS_START: Final = 3
_BACKLOG: Final = max(socket.SOMAXCONN, 4096)


def open_listeners(binds: Sequence[str]) -> list[socket.socket]:
    """Bind and listen on each address of ``binds``; return the sockets.

    An address is ``HOST:PORT`` (``127.0.0.1:8000``, ``[::1]:8000``, port 0
    for any free one) or ``unix:PATH``. The sockets listen with the system's
    longest queue, are not inherited by child processes unless passed to them
    (`serve_workers` does), and are the caller's to close, with
    `close_listeners`, which also removes the files of ``unix:`` sockets. A
    ``unix:`` file left behind by a process that is gone (a connection to it
    is refused) is replaced. Not a checkpoint.

    Raises:
        ValueError: if ``binds`` is empty or an address is not of those forms.
        OSError: if an address cannot be bound, or a ``unix:`` path is a live
            socket or not a socket at all; the message names it, and the
            sockets already opened are closed (and their files removed).
    """
    if isinstance(binds, str) or not binds:
        raise ValueError(f"binds must be a non-empty list of addresses, not {binds!r}")
    opened: list[socket.socket] = []
    try:
        for bind in binds:
            opened.append(_listen(bind))
    except BaseException:
        close_listeners(opened)
        raise
    return opened


def close_listeners(sockets: Iterable[socket.socket]) -> None:
    """Close ``sockets``, and remove the files of those `open_listeners` bound.

    A ``unix:`` socket's file is removed only if it is still the one that
    `open_listeners` made (same device and inode): if another process has
    bound the path since, its file stays. Sockets from anywhere else (such as
    `systemd_listeners`) are only closed. Not a checkpoint.
    """
    for sock in sockets:
        if isinstance(sock, _UnixListener):
            sock.remove_file()
        sock.close()


class _UnixListener(socket.socket):
    """A ``unix:`` listening socket that remembers which file it made."""

    # The file's (st_dev, st_ino) once bound; None until then, and once removed.
    file_identity: tuple[int, int] | None = None

    def remove_file(self) -> None:
        identity, self.file_identity = self.file_identity, None
        if identity is None:
            return  # never bound, or removed already
        path = cast("str", self.getsockname())
        if _identity(path) == identity:
            os.unlink(path)


def _identity(path: str) -> tuple[int, int] | None:
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return None
    return status.st_dev, status.st_ino


def _listen(bind: str) -> socket.socket:
    family, address = _parse(bind)
    sock = (
        _UnixListener(family, socket.SOCK_STREAM)
        if family == socket.AF_UNIX
        else socket.socket(family, socket.SOCK_STREAM)
    )
    try:
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            if isinstance(sock, _UnixListener):
                _bind_file(sock, cast("str", address))
            else:
                sock.bind(address)
        except OSError as exc:
            text = f"cannot listen on {bind}: {exc.strerror}"
            raise OSError(exc.errno, text) from exc
        sock.listen(_BACKLOG)
    except BaseException:
        close_listeners([sock])
        raise
    return sock


def _bind_file(sock: _UnixListener, path: str) -> None:
    try:
        sock.bind(path)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        _remove_stale(path)
        sock.bind(path)
    sock.file_identity = _identity(path)


def _remove_stale(path: str) -> None:
    """Remove ``path`` if it is a socket file nobody listens on; raise otherwise."""
    if not stat.S_ISSOCK(os.lstat(path).st_mode):
        raise OSError(errno.EADDRINUSE, "the path exists and is not a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        # Not blocking: a listener whose queue is full makes connect() wait;
        # it says EAGAIN here instead, and is as live as one that accepts.
        probe.setblocking(False)
        try:
            probe.connect(path)
        except BlockingIOError:
            pass
        except ConnectionRefusedError:
            # Nobody listens: a file left by a process that died. Between the
            # probe and the unlink another process could bind it; binding
            # again then fails, and says so.
            os.unlink(path)
            return
    raise OSError(errno.EADDRINUSE, "another process listens there")


def _parse(bind: str) -> tuple[socket.AddressFamily, str | tuple[str, int]]:
    if not isinstance(cast("object", bind), str):
        raise ValueError(f"an address must be a string, not {bind!r}")
    if bind.startswith("unix:") and len(bind) > len("unix:"):
        return socket.AF_UNIX, bind[len("unix:") :]
    host, colon, port = bind.rpartition(":")
    if not colon or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"an address must be HOST:PORT or unix:PATH, not {bind!r}")
    if host.startswith("[") and host.endswith("]"):
        return socket.AF_INET6, (host[1:-1], int(port))
    return socket.AF_INET, (host or "0.0.0.0", int(port))


def describe(sock: socket.socket) -> str:
    """``http://127.0.0.1:8000`` or ``unix:/path`` for a listening socket."""
    name: object = sock.getsockname()
    if sock.family == socket.AF_UNIX:
        return f"unix:{name!s}"
    host, port = cast("tuple[str, int]", name)[:2]
    return f"[{host}]:{port}" if sock.family == socket.AF_INET6 else f"{host}:{port}"


def systemd_listeners(
    environ: MutableMapping[str, str] = os.environ, *, unset_environment: bool = True
) -> list[socket.socket]:
    """Return the sockets systemd's socket activation passed to this process.

    They are the descriptors from 3 on, as many as ``$LISTEN_FDS`` says, if
    ``$LISTEN_PID`` is this process's id (sd_listen_fds(3)); otherwise there
    are none, and the list is empty. They are made not inheritable (workers
    get them passed explicitly). Not a checkpoint.

    Args:
        environ (~collections.abc.MutableMapping[str, str]): where to read,
            `os.environ` by default.
        unset_environment (bool): remove ``LISTEN_PID``, ``LISTEN_FDS`` and
            ``LISTEN_FDNAMES`` from ``environ``, so that no child process
            takes the variables as meant for itself.

    Raises:
        ValueError: if ``$LISTEN_FDS`` is not a number, or a descriptor it
            counts is not a stream socket.
    """
    pid, count = environ.get("LISTEN_PID", ""), environ.get("LISTEN_FDS", "")
    if unset_environment:
        for name in SYSTEMD_VARIABLES:
            environ.pop(name, None)
    if not pid or not pid.isdigit() or int(pid) != os.getpid():
        return []
    if not count.isdigit():
        raise ValueError(f"LISTEN_FDS must be a number of sockets, not {count!r}")
    fds = range(_SD_LISTEN_FDS_START, _SD_LISTEN_FDS_START + int(count))
    return [_adopt(fd, "LISTEN_FDS") for fd in fds]


def _adopt(fd: int, variable: str) -> socket.socket:
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ValueError(
            f"{variable}: descriptor {fd} is not a socket ({exc})"
        ) from exc
    if sock.type != socket.SOCK_STREAM:
        sock.detach()
        raise ValueError(f"{variable}: descriptor {fd} is not a stream socket")
    sock.set_inheritable(False)
    return sock


def inherited_fds(environ: MutableMapping[str, str] = os.environ) -> list[int]:
    """The descriptors of a worker's inherited sockets, as the supervisor named them.

    Raises:
        LookupError: if this process was not started by `serve_workers`.
        ValueError: if ``$TRIO_GRACEFUL_WORKER_FDS`` is malformed.
    """
    value = environ.get(FDS_VARIABLE)
    if value is None:
        raise LookupError(
            f"${FDS_VARIABLE} is not set: this process was not started as a "
            f"worker by trio_graceful.workers.serve_workers"
        )
    parts = value.split(",") if value else []
    if not all(part.isdigit() for part in parts):
        raise ValueError(f"{FDS_VARIABLE} must list descriptors, not {value!r}")
    return [int(part) for part in parts]


def inherited_sockets(
    environ: MutableMapping[str, str] = os.environ,
) -> list[socket.socket]:
    """Return the listening sockets this worker inherited from its supervisor.

    In the order the supervisor was given them (its ``--bind`` options, or
    systemd's ``$LISTEN_FDS``). Closing one closes this worker's descriptor
    only: the socket, and its queue, stay open in the supervisor. For a
    server that takes addresses, such as `trio_graceful.asgi.serve_asgi`,
    `inherited_binds` gives the same sockets as ``fd://N`` addresses. Not a
    checkpoint.

    Raises:
        LookupError: if this process was not started by `serve_workers`.
        ValueError: if a descriptor is not a stream socket.
    """
    return [_adopt(fd, FDS_VARIABLE) for fd in inherited_fds(environ)]


def inherited_binds(environ: MutableMapping[str, str] = os.environ) -> list[str]:
    """Return the inherited sockets as ``fd://N`` addresses, for Hypercorn's ``bind``.

    ``serve_asgi(inbox, app, bind=inherited_binds())`` serves the sockets
    of `inherited_sockets`. Not a checkpoint.

    Raises:
        LookupError: if this process was not started by `serve_workers`.
    """
    return [f"fd://{fd}" for fd in inherited_fds(environ)]
