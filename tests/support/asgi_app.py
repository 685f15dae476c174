"""A small raw ASGI app for the tests: every behaviour a drain meets, by path.

* ``/work?s=S``: waits S seconds (Trio time), answers ``done`` with a
  Content-Length.
* ``/stream?n=N&s=S``: N chunks ``data: i\\n\\n``, one every S seconds,
  chunked.
* ``/sized?n=N&s=S``: like ``/stream`` with a Content-Length for all N
  chunks, so that a cut in the middle cannot be ended cleanly.
* ``/until-stop``: a stream that sends ``tick`` every second until STOP
  (`trio_graceful.asgi.until_stop`), then ``bye``.
* ``/wait-stop``: answers once the server got STOP, with the time left.
* ``/fail``: raises before answering.
* a WebSocket: accepts, echoes text until STOP, then CLOSE 1001 and waits
  for the client's CLOSE.

Its lifespan records, in `Log`, when it started and when it shut down.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import attrs
import trio

import trio_graceful
import trio_graceful.asgi
from tests.support.asgi_server import Receive, Scope, Send


@attrs.define
class Log:
    """What the app saw: its lifespan, and each request's STOP."""

    events: list[tuple[str, float]] = attrs.field(factory=list[tuple[str, float]])

    def add(self, what: str) -> None:
        self.events.append((what, trio.current_time()))

    def when(self, what: str) -> float:
        return next(time for name, time in self.events if name == what)


def _query(scope: Scope) -> dict[str, float]:
    query = parse_qs(scope["query_string"].decode())
    return {name: float(values[0]) for name, values in query.items()}


async def _start(
    send: Send, status: int = 200, headers: list[Any] | None = None
) -> None:
    await send(
        {"type": "http.response.start", "status": status, "headers": headers or []}
    )


async def _body(send: Send, body: bytes, more: bool = False) -> None:
    await send({"type": "http.response.body", "body": body, "more_body": more})


def make_app(log: Log) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                log.add(message["type"])
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        elif scope["type"] == "websocket":
            await echo_until_stop(receive, send)
        else:
            await http(scope, send)

    async def http(scope: Scope, send: Send) -> None:
        path, query = scope["path"], _query(scope)
        if path == "/work":
            await trio.sleep(query.get("s", 0))
            await _start(send, headers=[(b"content-length", b"4")])
            await _body(send, b"done")
        elif path in ("/stream", "/sized"):
            count, every = int(query["n"]), query["s"]
            headers = []
            if path == "/sized":
                headers = [(b"content-length", str(10 * count).encode())]
            await _start(send, headers=headers)
            for i in range(count):
                await _body(
                    send, f"data: {i:02}\n\n".encode()[:10].ljust(10), more=True
                )
                await trio.sleep(every)
            await _body(send, b"")
        elif path == "/until-stop":
            await _start(send)
            while (
                await trio_graceful.asgi.until_stop(trio.sleep, 1)
                is not trio_graceful.STOP
            ):
                await _body(send, b"tick\n", more=True)
            log.add("stream heard STOP")
            await _body(send, b"bye\n")
        elif path == "/wait-stop":
            await trio_graceful.asgi.wait_stop()
            left = trio_graceful.asgi.stop_deadline() - trio.current_time()
            log.add("request heard STOP")
            await _start(send)
            await _body(send, f"{left:.1f}".encode())
        elif path == "/fail":
            raise RuntimeError("the app failed")
        else:
            await _start(send, 404)
            await _body(send, b"")

    async def echo_until_stop(receive: Receive, send: Send) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        while True:
            message = await trio_graceful.asgi.until_stop(receive)
            if message is trio_graceful.STOP:
                break
            if message["type"] == "websocket.disconnect":
                return
            await send({"type": "websocket.send", "text": message["text"]})
        await send({"type": "websocket.close", "code": 1001})
        log.add("websocket sent CLOSE")
        while (await receive())["type"] != "websocket.disconnect":
            pass
        log.add("websocket got CLOSE")

    return app
