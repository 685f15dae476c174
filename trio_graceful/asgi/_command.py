"""The command line: an ASGI app in N worker processes behind shared sockets.

``python -m trio_graceful.asgi MODULE:APP --bind HOST:PORT [--bind ...]
[--workers N] [--grace S] [--drain-delay S] [--health-port P]
[--ready-timeout S] [--app-dir DIR]``

This process is the supervisor (`trio_graceful.workers.serve_workers` under
`trio_graceful.run`): it opens the sockets, or takes systemd's
(``$LISTEN_FDS``), and never imports the app. Each worker is a fresh
interpreter (``trio_graceful.asgi._workermain``) that imports the app from the
current directory or ``--app-dir``, as uvicorn and Hypercorn do, and serves it
with `serve_asgi` on the inherited sockets. SIGHUP reloads, SIGTTIN and
SIGTTOU add and remove a worker, SIGTERM and SIGINT stop (exit status 0
after a graceful stop).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence

import trio

import trio_graceful
from trio_graceful.workers import (
    close_listeners,
    open_listeners,
    serve_workers,
    systemd_listeners,
)

from ._workermain import check_app_name

LOG_FORMAT = "%(asctime)s [%(process)d] %(name)s %(levelname)s: %(message)s"
EXIT_CODES = trio_graceful.ExitCodes(clean_signals={signal.SIGINT, signal.SIGTERM})


def parser() -> argparse.ArgumentParser:
    """The command line's options."""
    result = argparse.ArgumentParser(
        prog="python -m trio_graceful.asgi",
        description=(
            "Serve an ASGI app in worker processes that share the listening "
            "sockets: SIGHUP reloads them one at a time, new worker first; "
            "SIGTTIN and SIGTTOU add and remove one; SIGTERM and SIGINT stop."
        ),
    )
    result.add_argument("app", type=check_app_name, help="the app, as MODULE:APP")
    result.add_argument(
        "--bind",
        action="append",
        metavar="HOST:PORT",
        help="an address to listen on, HOST:PORT or unix:PATH; repeat for more "
        "(default 127.0.0.1:8000; ignored under systemd's socket activation)",
    )
    result.add_argument("--workers", type=_positive, default=1, help="default 1")
    result.add_argument("--grace", type=_seconds, default=10.0, help="default 10")
    result.add_argument("--drain-delay", type=_seconds, default=0.0, help="default 0")
    result.add_argument(
        "--health-port", type=int, help="serve /livez, /readyz, /statusz"
    )
    result.add_argument(
        "--ready-timeout",
        type=_seconds,
        default=30.0,
        help="seconds a worker has to become ready (default 30)",
    )
    result.add_argument(
        "--app-dir",
        default=".",
        help="where the workers import the app from (default: the current folder)",
    )
    return result


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    # Read before trio_graceful.run, which removes it: reloads are told there.
    notify_socket = os.environ.get("NOTIFY_SOCKET")
    sockets = systemd_listeners()
    if sockets and args.bind:
        logging.getLogger("trio_graceful.workers").warning(
            "using the sockets of systemd's socket activation; --bind is ignored"
        )
    try:
        sockets = sockets or open_listeners(args.bind or ["127.0.0.1:8000"])
    except (OSError, ValueError) as exc:
        print(f"python -m trio_graceful.asgi: {exc}", file=sys.stderr)
        return 2
    command = [
        sys.executable,
        "-m",
        "trio_graceful.asgi._workermain",
        args.app,
        "--app-dir",
        os.path.abspath(args.app_dir),
        "--grace",
        repr(args.grace),
    ]
    serve = functools.partial(
        serve_workers,
        sockets=sockets,
        workers=args.workers,
        ready_timeout=args.ready_timeout,
        notify_socket=notify_socket,
    )
    try:
        return trio_graceful.run(
            _supervise,
            serve,
            command,
            grace=args.grace,
            drain_delay=args.drain_delay,
            health_port=args.health_port,
            exit_codes=EXIT_CODES,
            name="trio_graceful.asgi",
        )
    finally:
        close_listeners(sockets)


async def _supervise(
    serve: Callable[..., Awaitable[None]],
    command: list[str],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    runner = trio_graceful.current_runner()
    await runner.start_service(serve, command, name="workers")
    task_status.started()
    _, inbox = runner.root.open_inbox()
    await inbox.receive()  # STOP: main returns, then the workers stop
