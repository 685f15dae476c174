"""A supervisor built on the library, for the tests: ``serve_workers`` under ``run``.

``python -m tests.support.workers_program --workers N --max-restarts R
--restart-window T [--hold] -- COMMAND...`` runs COMMAND as N workers, on the
sockets of systemd's socket activation or, without them, on one socket bound
to a free port of 127.0.0.1.

With ``--hold``, the service is held between its workers' readiness and its
own: once every worker is ready it logs ``holding: ...`` and never reports
ready, so a test can stop it in that window at leisure.
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import trio

import trio_graceful
from trio_graceful.asgi._command import _supervise as supervise  # pyright: ignore[reportPrivateUsage]
from trio_graceful.workers import open_listeners, serve_workers, systemd_listeners


async def hold(
    serve: Callable[..., Awaitable[None]],
    inbox: trio_graceful.InboxReceiver[Any],
    command: list[str],
    *,
    task_status: trio.TaskStatus[None],
) -> None:
    """``serve``, whose workers become ready, while the service never does."""
    async with trio.open_nursery() as nursery:
        await nursery.start(serve, inbox, command)
        logging.getLogger("tests").info(
            "holding: the workers are ready, the service is not"
        )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--max-restarts", type=int, default=5)
    parser.add_argument("--restart-window", type=float, default=10.0)
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("command", nargs="+")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    sockets = systemd_listeners() or open_listeners(["127.0.0.1:0"])
    serve = functools.partial(
        serve_workers,
        sockets=sockets,
        workers=args.workers,
        max_restarts=args.max_restarts,
        restart_window=args.restart_window,
    )
    if args.hold:
        serve = functools.partial(hold, serve)
    return trio_graceful.run(supervise, serve, args.command)


if __name__ == "__main__":
    sys.exit(main())
