"""One worker of ``python -m trio_graceful.asgi``: the app, served on inherited sockets.

Run by the supervisor as ``python -m trio_graceful.asgi._workermain MODULE:APP
--app-dir DIR --grace S``. It imports the app, then serves it with
`serve_asgi` on the sockets named by ``$TRIO_GRACEFUL_WORKER_FDS`` under
`trio_graceful.run`, which says ``READY=1`` on the supervisor's
``$NOTIFY_SOCKET`` once the app's lifespan has started and the server
accepts. If the supervisor dies first, it stops as at SIGTERM
(`watch_supervisor`). It has no drain delay of its own: the supervisor's came first, and
a worker replaced by a reload must stop accepting at once, so that the
connections in the shared queue go to the others.

It also tells the supervisor how many requests it is running, for
``/statusz``: ``X_REQUESTS_IN_FLIGHT=N`` on the same socket when the count
has changed, looked at every `IN_FLIGHT_INTERVAL` seconds, so a busy
worker sends four datagrams a second at most, not one per request. It goes on
through the server's drain, to the last request.
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
from typing import Any, Final

import attrs
import trio

import trio_graceful
from trio_graceful.workers import inherited_binds, watch_supervisor

from .._deploy._sdnotify import SystemdNotifier, notifier_from_environment
from ..workers._workerprocess import IN_FLIGHT_FIELD
from ._server import AsgiServer, serve_asgi

_APP = re.compile(r"[\w.]+:[\w.]+", re.ASCII)
LOG_FORMAT = "%(asctime)s [%(process)d] %(name)s %(levelname)s: %(message)s"
IN_FLIGHT_INTERVAL: Final = 0.25
"""Seconds between two looks at the number of requests running."""


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
    parser = argparse.ArgumentParser(prog="python -m trio_graceful.asgi._workermain")
    parser.add_argument("app", type=check_app_name)
    parser.add_argument("--app-dir", default=".")
    parser.add_argument("--grace", type=float, default=10.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    binds = inherited_binds()
    # Read before trio_graceful.run, which removes it from the environment.
    notifier = notifier_from_environment(unset_environment=False)
    app = import_app(args.app, os.path.abspath(args.app_dir))
    return trio_graceful.run(
        _serve,
        app,
        binds,
        notifier,
        grace=args.grace,
        exit_codes=trio_graceful.ExitCodes(
            clean_signals={signal.SIGINT, signal.SIGTERM}
        ),
        name=f"worker {os.environ.get('TRIO_GRACEFUL_WORKER', '')}".strip(),
    )


async def _serve(
    app: object,
    binds: list[str],
    notifier: SystemdNotifier,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    runner = trio_graceful.current_runner()
    await runner.start_service(watch_supervisor, name="supervisor's lifeline")
    in_flight = _InFlight(notifier)
    # Started first, so it stops last: it reports through the server's drain.
    await runner.start_service(in_flight.serve, name="requests in flight")
    in_flight.server = await runner.start_service(
        functools.partial(serve_asgi, bind=binds), app
    )
    task_status.started()
    _, inbox = runner.root.open_inbox()
    await inbox.receive()  # STOP: main returns, and the server drains


@attrs.define(eq=False)
class _InFlight:
    """Tells the supervisor how many requests ``server`` runs, when that changed."""

    notifier: SystemdNotifier
    server: AsgiServer | None = None
    _sent: int | None = None

    def report(self) -> None:
        server = self.server
        running = 0 if server is None else server.statistics().requests_running
        if running != self._sent and self.notifier.notify(
            **{IN_FLIGHT_FIELD: str(running)}
        ):
            self._sent = running

    async def serve(
        self,
        inbox: trio_graceful.InboxReceiver[Any],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Report until STOP, which comes once the server has drained."""
        task_status.started()
        await inbox.until_stop(self._watch)
        self.report()

    async def _watch(self) -> None:
        while True:
            self.report()
            await trio.sleep(IN_FLIGHT_INTERVAL)


if __name__ == "__main__":
    sys.exit(main())
