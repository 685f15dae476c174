"""The requests of the WebSocket example: their protocol, and one connection's share.

A client sends text messages ``{"id": <int>, "work_ms": <int>}``
(`parse_request`) and gets ``{"id": <int>}`` once the work is done
(`answer`), or an error reply (`error_reply`). `Requests` keeps one
connection's requests in flight, and `ServerStatistics` counts them.

Part of ``examples/websocket_close_server.py``, which decides when a request
is read, worked on, refused and answered; see that file.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, TypeGuard, cast

import attrs
import trio

if TYPE_CHECKING:
    # Only a type here: the ASGI example uses this module without websockets.
    from websocket_connection import Message

MAX_WORK_MS = 3_600_000
"""The longest work a request may ask for: one hour."""


class InvalidRequest(ValueError):
    """A text message that is not a valid request; it gets an error reply."""

    def __init__(self, message: str, request_id: int | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _parse_int(digits: str) -> int:
    if len(digits.lstrip("-")) > 100:
        raise InvalidRequest("request has a number longer than 100 digits")
    return int(digits)


_DECODER = json.JSONDecoder(parse_int=_parse_int)


def parse_request(text: str) -> tuple[int, int]:
    """Return ``(id, work_ms)``; keys other than those two are ignored.

    Raises:
        InvalidRequest: if ``text`` is not a JSON object with an integer ``id``
            and an integer ``work_ms`` from 0 to `MAX_WORK_MS`.
    """
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise InvalidRequest("request is not valid JSON: it nests too deeply") from None
    except InvalidRequest:
        raise
    except ValueError as exc:
        raise InvalidRequest(f"request is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidRequest(
            'request must be a JSON object {"id": <int>, "work_ms": <int>}, '
            f"not {_show(value)}"
        )
    value = cast("dict[str, object]", value)
    if "id" not in value:
        raise InvalidRequest("request must have an id")
    request_id = value["id"]
    if not is_int(request_id):
        raise InvalidRequest(f"id must be an integer, not {_show(request_id)}")
    work_ms = value.get("work_ms")
    if work_ms is None:
        raise InvalidRequest("request must have a work_ms", request_id)
    if not (is_int(work_ms) and 0 <= work_ms <= MAX_WORK_MS):
        raise InvalidRequest(
            f"work_ms must be an integer from 0 to {MAX_WORK_MS}, not {_show(work_ms)}",
            request_id,
        )
    return request_id, work_ms


def answer(request_id: int) -> str:
    """The reply to a request whose work is done."""
    return f'{{"id": {request_id}}}'  # as json.dumps would, only faster


def error_reply(request_id: int | None, message: str) -> str:
    """An error reply, with the request's id if it had a valid one."""
    if request_id is None:
        return json.dumps({"error": message})
    return json.dumps({"id": request_id, "error": message})


@attrs.define
class ServerStatistics:
    """What a `WorkServer` has done so far, each thing counted once."""

    connections_accepted: int = 0
    connections_open: int = 0
    closed_gracefully: int = 0
    """Connections that ended after a close handshake (either side's CLOSE)."""
    hard_closed: int = 0
    """Connections closed without a handshake: a grace ran out, or it broke."""
    requests_read: int = 0
    answered: int = 0
    """Requests whose work was done and answered ``{"id": N}``."""
    refused: int = 0
    """Requests answered ``{"id": N, "error": "shutting down"}``."""
    lost: int = 0
    """Requests left without a reply because their client closed first, or the
    outer grace closed the connection."""
    malformed: int = 0
    """Messages that were not requests: error replies, CLOSE 1003."""
    draining_since: float | None = None
    """When the shutdown began (Trio time), or None."""

    def summary(self) -> str:
        """The one-line log entry of a shutdown."""
        return (
            f"shutdown: {self.closed_gracefully} connections closed gracefully, "
            f"{self.hard_closed} hard-closed; requests read: {self.requests_read} "
            f"= {self.answered} answered + {self.refused} refused + {self.lost} lost"
        )


@attrs.define(eq=False)
class Requests:
    """One connection's requests: at most ``limit`` worked on, the rest waiting.

    The work runs in ``nursery``, whose deadline is the cut-off: a request
    cut off keeps its place here, so that the connection refuses it.
    """

    nursery: trio.Nursery
    work: Callable[[Requests, int, int, int], Awaitable[None]]
    limit: int
    running: dict[int, int] = attrs.field(factory=dict[int, int])
    """Token -> id of each request being worked on."""
    waiting: deque[tuple[int, int]] = attrs.field(factory=deque[tuple[int, int]])
    _tokens: Iterator[int] = attrs.field(factory=itertools.count)
    _slot_freed: trio.Event | None = None
    _until_idle: trio.CancelScope | None = None

    @property
    def full(self) -> bool:
        """Whether ``limit`` requests are running or waiting: read no more."""
        return len(self.running) + len(self.waiting) >= self.limit

    def add(self, request_id: int, work_ms: int) -> None:
        """Start ``work`` for a request, or queue it if ``limit`` are running."""
        if len(self.running) < self.limit:
            token = next(self._tokens)
            self.running[token] = request_id
            self.nursery.start_soon(self.work, self, token, request_id, work_ms)
        else:
            self.waiting.append((request_id, work_ms))

    def finish(self, token: int) -> None:
        """Forget a request whose reply is queued; start the next one waiting."""
        del self.running[token]
        if self.waiting:
            self.add(*self.waiting.popleft())
        if self._slot_freed is not None and not self.full:
            self._slot_freed.set()
        if not self.running and self._until_idle is not None:
            self._until_idle.cancel()

    def give_up(self) -> list[int]:
        """Forget every request still here; return their ids."""
        ids = [*self.running.values(), *(request_id for request_id, _ in self.waiting)]
        self.running.clear()
        self.waiting.clear()
        return ids

    async def wait_for_a_slot(self) -> None:
        while self.full:
            self._slot_freed = trio.Event()
            await self._slot_freed.wait()
        self._slot_freed = None

    async def run_until_idle(
        self, receive: Callable[[], Awaitable[list[Message]]]
    ) -> list[Message] | None:
        """Run a cancel-safe ``receive``; None if nothing was, or is, in flight."""
        if self.running:
            with trio.CancelScope() as self._until_idle:
                return await receive()
        return None
