"""One worker of ``python -m trio_graceful.asgi``: the app, served on inherited sockets.

Run by the supervisor as ``python -m trio_graceful.asgi._worker MODULE:APP
--app-dir DIR --grace S``. It imports the app, then serves it with
`serve_asgi` on the sockets named by ``$TRIO_GRACEFUL_WORKER_FDS`` under
`trio_graceful.run`, which says ``READY=1`` on the supervisor's
``$NOTIFY_SOCKET`` once the app's lifespan has started and the server
accepts. It has no drain delay of its own: the supervisor's came first, and
a worker replaced by a reload must stop accepting at once, so that the
connections in the shared queue go to the others.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import os
import re
import signal
import sys
from collections.abc import Sequence

import trio

import trio_graceful
from trio_graceful.workers import inherited_binds

from ._server import serve_asgi

_APP = re.compile(r"[\w.]+:[\w.]+", re.ASCII)
LOG_FORMAT = "%(asctime)s [%(process)d] %(name)s %(levelname)s: %(message)s"


def check_app_name(text: str) -> str:
    """Return ``text`` if it is ``MODULE:APP``.

    Raises:
        argparse.ArgumentTypeError: if it is not.
    """
    if not _APP.fullmatch(text):
        raise argparse.ArgumentTypeError(f"the app must be MODULE:APP, not {text!r}")
    return text


def import_app(name: str, app_dir: str) -> object:
    """Import ``MODULE:APP`` with ``app_dir`` first on the path."""
    sys.path.insert(0, app_dir)
    module_name, _, attributes = name.partition(":")
    found: object = importlib.import_module(module_name)
    for attribute in attributes.split("."):
        found = getattr(found, attribute)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Import the app and serve it until SIGTERM; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m trio_graceful.asgi._worker")
    parser.add_argument("app", type=check_app_name)
    parser.add_argument("--app-dir", default=".")
    parser.add_argument("--grace", type=float, default=10.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    binds = inherited_binds()
    app = import_app(args.app, os.path.abspath(args.app_dir))
    return trio_graceful.run(
        _serve,
        app,
        binds,
        grace=args.grace,
        exit_codes=trio_graceful.ExitCodes(
            clean_signals={signal.SIGINT, signal.SIGTERM}
        ),
        name=f"worker {os.environ.get('TRIO_GRACEFUL_WORKER', '')}".strip(),
    )


async def _serve(
    app: object,
    binds: list[str],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    runner = trio_graceful.current_runner()
    await runner.start_service(functools.partial(serve_asgi, bind=binds), app)
    task_status.started()
    _, inbox = runner.root.open_inbox()
    await inbox.receive()  # STOP: main returns, and the server drains


if __name__ == "__main__":
    sys.exit(main())
