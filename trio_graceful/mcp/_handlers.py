"""Each request's handler as a child of the runner's root bundle.

The SDK runs every request's handler in a task group of its own, deep inside
its dispatcher. Tasks there are not children of any bundle: a tool could not
call `trio_graceful.run_in_thread` or `trio_graceful.run_process` (both
belong to the bundle whose child calls them), STOP would not reach its
threads and subprocesses, and the shutdown's report would not know it.

`HandlersInBundle` is a server middleware (the SDK's public hook around every
request) that moves the rest of the chain, handler included, into a child of
the bundle, named after the call (``tools/call sleep (id 3)``), and waits for
it. So a handler's threads get their stop flag at STOP, its subprocesses get
SIGTERM, the grace bounds it, the hard cancel ends it, and the report and the
emergency report name it. When the SDK cancels the request (the client sent
``notifications/cancelled``), the child is hard-cancelled and nothing else.
"""

from __future__ import annotations

from typing import Any, final

import attrs
import trio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED

from .._core._bundle import Bundle
from ._calls import describe_call


@final
@attrs.define(eq=False)
class _Outcome:
    """What a handler run as a child ended with; neither if it was cancelled."""

    value: HandlerResult = None
    error: Exception | None = None
    returned: bool = False


@final
@attrs.define(eq=False)
class HandlersInBundle:
    """A server middleware: each request's handler runs as a child of ``bundle``."""

    bundle: Bundle

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        """Run ``call_next(ctx)`` as a child of the bundle; notifications in place."""
        if ctx.request_id is None:
            return await call_next(ctx)
        name = describe_call(ctx.method, ctx.params, ctx.request_id)
        outcome = _Outcome()
        done = trio.Event()
        scope = trio.CancelScope()

        async def handle() -> None:
            try:
                with scope:
                    try:
                        outcome.value = await call_next(ctx)
                        outcome.returned = True
                    except Exception as exc:  # the SDK turns it into the answer
                        outcome.error = exc
            finally:
                done.set()

        self.bundle.start_soon(handle, name=name)
        try:
            await done.wait()
        except BaseException:
            # The SDK stopped waiting: the client cancelled this request, or
            # the whole connection is being torn down.
            scope.cancel(reason=f"the SDK cancelled {name}")
            raise
        if outcome.error is not None:
            raise outcome.error
        if not outcome.returned:
            # Hard-cancelled by the bundle while the SDK's task was not.
            raise MCPError(
                CONNECTION_CLOSED, "server is shutting down; the call was cancelled"
            )
        return outcome.value
