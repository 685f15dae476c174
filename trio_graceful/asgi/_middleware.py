"""`AdmissionMiddleware`: an ASGI middleware that answers 503 at once when full.

A group of routes whose work is expensive (blocking calls in threads, say)
gets a quota; a request beyond it is refused at once with ``503 Service
Unavailable`` and ``Retry-After``, instead of queueing for threads that
every route shares. The quota is a `trio_graceful.AdmissionGate`, whose
statistics tell how many were admitted and refused. The middleware has the
shape of Starlette's (the app first, then keyword options), so that
``Middleware(AdmissionMiddleware, gate=gate)`` works as well as wrapping an
app by hand.
"""

# No "from __future__ import annotations": the docs read the types of
# __init__'s arguments from the class, where string annotations stay unresolved.
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, cast, final

from .._children._admission import AdmissionGate, BusyError
from .._core._checks import check_count

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@final
class AdmissionMiddleware:
    """An ASGI app that lets at most ``gate.quota`` of ``app``'s requests run at once.

    A request (HTTP or WebSocket) that finds the gate full is answered at
    once: ``503`` with ``Retry-After: retry_after``, the same as the
    WebSocket handshake's answer; the connection stays open for the next
    request. Admitted requests hold their place until the app returns.
    Lifespan messages pass through. Use it on a group of routes, as
    Starlette's ``Mount("/reports", app=AdmissionMiddleware(reports,
    gate=gate))``, or on a whole app (``Middleware(AdmissionMiddleware,
    gate=gate)``).

    Args:
        app: The ASGI app to guard.
        gate (trio_graceful.AdmissionGate): The quota, shared by every route
            it guards.
        retry_after (int): Seconds the client is told to wait (at least 1).

    Raises:
        TypeError: if ``app`` is not callable, ``gate`` not an
            `trio_graceful.AdmissionGate` or ``retry_after`` not an int.
        ValueError: if ``retry_after`` is less than 1.
    """

    __slots__ = ("_headers", "app", "gate")

    def __init__(
        self, app: ASGIApp, *, gate: AdmissionGate, retry_after: int = 1
    ) -> None:
        if not callable(app):
            raise TypeError(f"app must be an ASGI app, not {app!r}")
        if not isinstance(cast("object", gate), AdmissionGate):
            raise TypeError(f"gate must be an AdmissionGate, not {gate!r}")
        check_count("retry_after", retry_after)
        self.app = app
        """The ASGI app it guards."""
        self.gate = gate
        """The quota of ``app``'s requests."""
        self._headers = [
            (b"content-length", b"0"),
            (b"retry-after", str(retry_after).encode()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run ``app`` for this request if the gate admits it; else answer 503.

        No checkpoint of its own: it awaits only ``app``, or ``send``.
        """
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        try:
            self.gate.acquire_nowait()
        except BusyError:
            prefix = "" if scope["type"] == "http" else "websocket."
            await send(
                {
                    "type": f"{prefix}http.response.start",
                    "status": 503,
                    "headers": self._headers,
                }
            )
            await send({"type": f"{prefix}http.response.body", "body": b""})
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.gate.release()
