"""Several worker processes of one service behind shared listening sockets.

A supervisor (`serve_workers`, a service of `trio_graceful.run`) opens the
listening sockets once (`open_listeners`) or takes them from systemd
(`systemd_listeners`), and runs N worker processes that inherit them. It
reloads them on SIGHUP one at a time, new worker first; replaces a worker
that crashes; adds and removes workers on SIGTTIN and SIGTTOU; and stops
them all at once, within the runner's bounds. A worker finds its sockets
with `inherited_sockets` or `inherited_binds`, and is ready when it says
``READY=1`` on ``$NOTIFY_SOCKET``, as every `trio_graceful.run` program
does once ``main`` is ready. A worker that runs `watch_supervisor` stops
gracefully if its supervisor dies (is SIGKILLed, say) before it.

``python -m trio_graceful.asgi MODULE:APP --workers N`` is this for an ASGI
app.
"""

from typing import TYPE_CHECKING

from .._exports import lazy_names as _lazy_names

if TYPE_CHECKING:
    from ._lifeline import (
        inherited_lifeline as inherited_lifeline,
        watch_supervisor as watch_supervisor,
    )
    from ._pool import (
        WorkerCrashLoopError as WorkerCrashLoopError,
        WorkerPool as WorkerPool,
        WorkerPoolStatistics as WorkerPoolStatistics,
        serve_workers as serve_workers,
    )
    from ._sockets import (
        close_listeners as close_listeners,
        inherited_binds as inherited_binds,
        inherited_sockets as inherited_sockets,
        open_listeners as open_listeners,
        systemd_listeners as systemd_listeners,
    )
    from ._workerprocess import (
        WorkerInfo as WorkerInfo,
        WorkerState as WorkerState,
    )

# Each name of the block above is loaded on first use (see trio_graceful._exports).
if not TYPE_CHECKING:
    __getattr__, __dir__ = _lazy_names(globals())
del _lazy_names
