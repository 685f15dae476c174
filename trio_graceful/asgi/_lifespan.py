"""The app's lifespan: Hypercorn's, with its failures raised where they are awaited.

Port map, against Hypercorn 0.18.0's ``hypercorn/trio/lifespan.py``
(``Lifespan``), whose methods `AppLifespan` calls unchanged except one:

* ``asgi_send`` (overridden): upstream sets its startup or shutdown event
  for a ``complete`` message and raises ``LifespanFailureError`` for a
  ``failed`` one, in the app's lifespan task, where ``handle_lifespan``
  re-raises it; ``wait_for_startup`` then returns as if all was well (the
  ``finally`` of ``handle_lifespan`` sets both events). Here the failure is
  also kept, and raised again by `AppLifespan.start` or
  `AppLifespan.shut_down`, in the server's task.
* ``handle_lifespan``: upstream's, run by ``_run``, which drops the
  failure it raises (the caller gets it instead).
* ``wait_for_shutdown``: upstream's, which bounds the shutdown with
  ``shutdown_timeout`` but says "startup" when it runs out; `shut_down`
  raises the same error naming the shutdown.
"""

from __future__ import annotations

import contextlib
from typing import final

import trio
from hypercorn.trio.lifespan import Lifespan
from hypercorn.typing import ASGISendEvent
from hypercorn.utils import LifespanFailureError, LifespanTimeoutError

from ._serverstate import ServerState


@final
class AppLifespan(Lifespan):
    """Hypercorn's lifespan, whose failures are raised where they are awaited.

    Hypercorn raises a failure in the lifespan's own task, and its
    ``wait_for_startup`` returns as if all was well; here the failure is
    kept when the app reports it, and raised by `start` or `shut_down`.
    """

    def __init__(self, state: ServerState) -> None:
        super().__init__(state.app, state.config, state.lifespan_state)
        self._failure: LifespanFailureError | None = None

    async def start(self, nursery: trio.Nursery) -> None:
        """Run the lifespan in ``nursery``; return once the app has started.

        Raises:
            hypercorn.utils.LifespanFailureError: if the app's startup failed.
            hypercorn.utils.LifespanTimeoutError: if it took longer than
                ``startup_timeout``.
        """
        await nursery.start(self._run)
        await self.wait_for_startup()
        self._raise_failure()

    async def shut_down(self) -> None:
        """Tell the app to shut down; return once it has.

        Raises:
            hypercorn.utils.LifespanFailureError: if the app's shutdown failed.
            hypercorn.utils.LifespanTimeoutError: if it took longer than
                ``shutdown_timeout``.
        """
        try:
            await self.wait_for_shutdown()
        except LifespanTimeoutError as exc:
            raise LifespanTimeoutError("shutdown") from exc.__cause__
        self._raise_failure()

    async def asgi_send(self, message: ASGISendEvent) -> None:
        try:
            await super().asgi_send(message)
        except LifespanFailureError as exc:
            self._failure = exc
            raise

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    async def _run(self, *, task_status: trio.TaskStatus[None]) -> None:
        with contextlib.suppress(LifespanFailureError):  # raised by start, shut_down
            await self.handle_lifespan(task_status=task_status)
