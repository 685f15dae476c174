"""The requests a server has been handed and not yet answered: its calls in flight.

A graceful stop waits for these and nothing else. It cannot simply wait for
the handlers to return: the SDK writes a handler's answer after the handler
has returned, and ends every handler still running (answer included) the
moment its input ends. So a call counts as in flight from the moment its
request is passed on to the SDK until its answer has gone out (or the client
cancelled it, after which the SDK never answers it), which only the
transport sees. `CallsInFlight` keys them as the SDK does (``"7"`` and
``7`` are one id), and names each call the way the log and the task tree
name it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, final

import attrs
import trio
from mcp.shared.dispatcher import coerce_request_id
from mcp_types import RequestId


def describe_call(
    method: str, params: Mapping[str, Any] | None, request_id: RequestId
) -> str:
    """Name a call for people: ``tools/call sleep (id 3)``."""
    tool = params.get("name") if method == "tools/call" and params else None
    what = f"{method} {tool}" if isinstance(tool, str) else method
    return f"{what} (id {request_id!r})"


@final
@attrs.define(eq=False)
class CallsInFlight:
    """The calls in flight, and a way to wait until there are none."""

    # The name of each call, by id, oldest first.
    _calls: dict[RequestId, str] = attrs.field(factory=dict[RequestId, str])
    _emptied: trio.Event = attrs.field(factory=trio.Event)

    def start(
        self, method: str, params: Mapping[str, Any] | None, request_id: RequestId
    ) -> None:
        """Record a request that is being passed on. Not a checkpoint."""
        name = describe_call(method, params, request_id)
        self._calls[coerce_request_id(request_id)] = name

    def end(self, request_id: RequestId) -> str | None:
        """Forget a call that was answered or cancelled; its name, if it was known.

        Not a checkpoint.
        """
        call = self._calls.pop(coerce_request_id(request_id), None)
        if not self._calls:
            self._emptied.set()
        return call

    def __len__(self) -> int:
        """How many calls are in flight. Not a checkpoint."""
        return len(self._calls)

    def __contains__(self, request_id: RequestId) -> bool:
        """Whether the call with this id is in flight. Not a checkpoint."""
        return coerce_request_id(request_id) in self._calls

    def describe(self) -> str:
        """``2 calls in flight: a, b`` (oldest first), or ``no call in flight``."""
        if not self._calls:
            return "no call in flight"
        names = ", ".join(self._calls.values())
        count = len(self._calls)
        return f"{count} {'call' if count == 1 else 'calls'} in flight: {names}"

    async def wait_empty(self) -> None:
        """Wait until no call is in flight. This is a checkpoint."""
        while self._calls:
            self._emptied = trio.Event()
            await self._emptied.wait()
        await trio.lowlevel.checkpoint()
