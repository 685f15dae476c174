"""ASGI apps on Hypercorn's protocols, with a shutdown that loses no request.

`serve_asgi` serves a Starlette, FastAPI, Quart-Trio or any other ASGI app
with Hypercorn's HTTP/1.1, HTTP/2 and WebSocket protocols and its lifespan
support, as a service of `trio_graceful.run` or a child of any bundle. At
STOP it drains: every request already received is answered, the last
response on each connection says ``Connection: close``, streams and
WebSockets hear STOP in band (`stop_received`, `wait_stop`, `until_stop`),
and what is still running at the cut-off ends its response properly.

Needs the ``asgi`` extra: ``pip install "trio-graceful[asgi]"``.
"""

from typing import TYPE_CHECKING

from .._exports import lazy_names as _lazy_names

if TYPE_CHECKING:
    from ._drain import (
        current_stop_flag as current_stop_flag,
        stop_deadline as stop_deadline,
        stop_received as stop_received,
        until_stop as until_stop,
        wait_stop as wait_stop,
    )
    from ._middleware import (
        AdmissionMiddleware as AdmissionMiddleware,
    )
    from ._server import (
        AsgiServer as AsgiServer,
        serve_asgi as serve_asgi,
    )
    from ._serverstate import (
        AsgiServerStatistics as AsgiServerStatistics,
    )
    from ._syncendpoints import (
        sync_to_async as sync_to_async,
    )

# Each name of the block above is loaded on first use (see trio_graceful._exports).
if not TYPE_CHECKING:
    __getattr__, __dir__ = _lazy_names(globals())
del _lazy_names
