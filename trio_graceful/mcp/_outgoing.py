"""What the SDK writes, on its way to stdout: its write stream.

The SDK writes through a stream it is handed (`WireOut`), from the task that
has something to say: a handler's answer from the handler's task, at the
hard cancel too (the SDK then answers each request it was handling with an
error, under a shield). Writing there and then, rather than handing lines to
a writer task, is what lets those last answers out: at the hard cancel a
writer task would be cancelled with everything else.

On the way, each answer takes its call off the calls in flight, and the
SDK's error for a request its shutdown cancelled, *Connection closed*, is
replaced by one that says what happened: the server is shutting down.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Final, final

import anyio
import attrs
import trio
from mcp.shared.message import SessionMessage
from mcp_types import (
    CONNECTION_CLOSED,
    ErrorData,
    JSONRPCError,
    JSONRPCMessage,
    JSONRPCResponse,
    RequestId,
)

from ._calls import CallsInFlight
from ._stdout import LineWriter

REFUSED: Final = "server is shutting down; the request was not started"
"""The error message for a request that arrives after STOP."""

CANCELLED: Final = "server is shutting down; the call was cancelled before it finished"
"""The error message for a call still running at the hard cancel."""


def shutdown_error(request_id: RequestId, message: str) -> SessionMessage:
    """A JSON-RPC error for ``request_id`` that says the server is shutting down.

    Its code is the SDK's ``CONNECTION_CLOSED`` (-32000), which the SDK itself
    answers with when its shutdown cancels a request.
    """
    error = ErrorData(code=CONNECTION_CLOSED, message=message)
    return SessionMessage(JSONRPCError(jsonrpc="2.0", id=request_id, error=error))


def _answered(message: JSONRPCMessage) -> RequestId | None:
    if isinstance(message, JSONRPCResponse | JSONRPCError):
        return message.id
    return None


@final
@attrs.define(eq=False)
class WireOut:
    """The SDK's write stream: each message as one JSON line on stdout.

    ``on_broken`` is called with the reason once, when stdout turns out to be
    no longer writable (the client closed its end); the SDK then gets
    `anyio.BrokenResourceError`, on which it drops what it meant to send.
    """

    _writer: LineWriter
    _calls: CallsInFlight
    _on_broken: Callable[[str], None]
    _closed: bool = attrs.field(default=False, init=False)

    async def send(self, item: SessionMessage, /) -> None:
        """Write ``item`` as a line; see `LineWriter.write_line`. A checkpoint.

        Raises:
            anyio.ClosedResourceError: if the stream was closed.
            anyio.BrokenResourceError: if stdout can no longer be written.
        """
        if self._closed:
            raise anyio.ClosedResourceError
        answered = _answered(item.message)
        message = item.message
        if (
            isinstance(message, JSONRPCError)
            and message.error.code == CONNECTION_CLOSED
            and answered is not None
            and answered in self._calls
        ):
            message = shutdown_error(answered, CANCELLED).message
        line = message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
        was_broken = self._writer.broken
        try:
            await self._writer.write_line(line.encode())
        except trio.BrokenResourceError as exc:
            if not was_broken:
                self._on_broken(str(exc))
            raise anyio.BrokenResourceError from exc
        finally:
            # Written, failed or cancelled: the SDK is done with the call.
            if answered is not None:
                self._calls.end(answered)

    async def aclose(self) -> None:
        """Refuse further messages (stdout itself stays open). A checkpoint."""
        self._closed = True
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> WireOut:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()
