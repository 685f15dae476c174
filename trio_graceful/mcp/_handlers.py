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

A transport that must cancel one call itself (the HTTP transport, at the
cut-off) sets a `HandlerWatch` in the context of the request it passes on;
the SDK runs the handler in that context, and the handler's cancel scope is
recorded there.
"""

from __future__ import annotations

import contextvars
from typing import Any, final

import attrs
import trio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED

from .._core._bundle import Bundle
from ._calls import describe_call
from ._outgoing import REFUSED


@final
@attrs.define(eq=False)
class HandlerWatch:
    """Where the handler of one request records its cancel scope, for its transport."""

    _scope: trio.CancelScope | None = None
    _cancelled: str | None = None

    def attach(self, scope: trio.CancelScope) -> None:
        """Record the handler's scope; cancel it at once if `cancel` came first."""
        self._scope = scope
        if self._cancelled is not None:
            scope.cancel(reason=self._cancelled)

    def cancel(self, reason: str) -> None:
        """Hard-cancel the handler, now or as soon as it starts. Not a checkpoint."""
        self._cancelled = reason
        if self._scope is not None:
            self._scope.cancel(reason=reason)


handler_watch: contextvars.ContextVar[HandlerWatch | None] = contextvars.ContextVar(
    "trio_graceful.mcp.handler_watch", default=None
)
"""The `HandlerWatch` of the request being passed on, if its transport set one."""


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
    inline: frozenset[str] = frozenset()
    """Methods whose handlers run in place, not as children (they start no work)."""

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        """Run ``call_next(ctx)`` as a child of the bundle; notifications in place."""
        if ctx.request_id is None or ctx.method in self.inline:
            return await call_next(ctx)
        name = describe_call(ctx.method, ctx.params, ctx.request_id)
        if self.bundle.closed:
            # Its shutdown ended before the handler could start: the request
            # came with STOP.
            raise MCPError(CONNECTION_CLOSED, REFUSED)
        outcome = _Outcome()
        done = trio.Event()
        scope = trio.CancelScope()
        watch = handler_watch.get()
        if watch is not None:
            watch.attach(scope)

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
