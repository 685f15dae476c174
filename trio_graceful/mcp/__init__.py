"""MCP servers made with the official ``mcp`` SDK, run by `trio_graceful.run`.

`serve_stdio` serves one over stdio: it exits on the first Ctrl+C or SIGTERM
after finishing its calls, never waits for stdin, and keeps the threads and
subprocesses of its tools under the runner's grace. `streamable_http_app`
serves one over Streamable HTTP with `trio_graceful.asgi.serve_asgi`: calls
finish, event streams close with a reconnect hint, calls cut off get an
answer. `open_event_store` keeps the events of those streams in SQLite or
PostgreSQL, so that a client can resume a stream on another replica. Needs
the ``mcp`` extra
(``pip install "trio-graceful[mcp]"``). See the how-to "MCP servers".
"""

from typing import TYPE_CHECKING

from .._exports import lazy_names as _lazy_names

if TYPE_CHECKING:
    from ._eventstore import (
        EventStoreStatistics as EventStoreStatistics,
        SharedEventStore as SharedEventStore,
        open_event_store as open_event_store,
    )
    from ._http import (
        streamable_http_app as streamable_http_app,
    )
    from ._stdio import (
        EXIT_CODES as EXIT_CODES,
        serve_stdio as serve_stdio,
    )

# Each name of the block above is loaded on first use (see trio_graceful._exports).
if not TYPE_CHECKING:
    __getattr__, __dir__ = _lazy_names(globals())
del _lazy_names
