"""`streamable_http_app`: an MCP server over Streamable HTTP, for `serve_asgi`.

The SDK's own app (``streamable_http_app()``) serves MCP over HTTP: each
request of a session is a POST whose answer streams back as server-sent
events, and a GET opens the session's standalone event stream. Served by
`trio_graceful.asgi.serve_asgi`, the calls in flight at STOP already finish
and their answers go out. What the SDK does not know is that a stop has
begun, and `_McpHttpApp`, an ASGI app around the SDK's, tells it:

1. after STOP, a POST that opens a session is answered ``503`` with
   ``Retry-After``; a request that would start work in an open session is
   answered at once with a JSON-RPC error (`REFUSED`); what starts no work
   (`NO_WORK`, notifications such as ``notifications/cancelled``, answers
   to the server's requests, ``DELETE``) still reaches the SDK;
2. at STOP each standalone GET stream is ended with a ``retry:`` field
   (SEP-1699), so that its client reconnects, to a replica that takes new
   work; a GET that arrives after STOP is answered ``503``;
3. at the cut-off (`serve_asgi` cancels the requests still running), each
   call still running is answered on its stream with a JSON-RPC error
   (`CANCELLED`) before `serve_asgi` ends that stream with its terminating
   chunk, and its handler is hard-cancelled (`HandlerWatch`);
4. when the app's lifespan ends, normally or at a second signal, every
   session's transport is terminated before the SDK cancels its sessions:
   the SDK then gives each handler still running a last write of one second
   (*shutdown error response … gave up: transport write blocked*), which a
   terminated transport refuses at once instead. And the heap is frozen at
   the interpreter's exit, as under `serve_stdio`.

Each request that starts work has its handler run as a child of a bundle of
the lifespan's, *MCP calls* (`HandlersInBundle`, as on stdio), which is shut
down at the server's STOP: its threads get their stop flag then, its inboxes
STOP, and what is left at the hard deadline is hard-cancelled.

A GET that resumes a stream (``Last-Event-ID``) is left to run at STOP, like
a call: what it replays may be a call's answer.

With an event store, each session's transport stores through a view of its
own (`SessionEvents`), so that a replay sends no other session's events.
`_SdkSessions` installs it, and lists the sessions to end: the one place
that reaches into the SDK's privates.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final, final

import trio
from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.server.streamable_http import (
    LAST_EVENT_ID_HEADER,
    MCP_SESSION_ID_HEADER,
    EventStore,
    StreamableHTTPServerTransport,
)
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types import (
    JSONRPCError,
    JSONRPCMessage,
    JSONRPCRequest,
    JSONRPCResponse,
    RequestId,
    jsonrpc_message_adapter,
)

from .._core._bundle import Bundle
from .._core._checks import check_count, check_seconds
from .._core._groups import is_cancellation
from .._core._log import library_logger
from .._core._openbundle import open_bundle
from .._core._stop import STOP
from .._run._program._runner import current_runner
from ..asgi._drain import Drain, current_drain
from ._calls import describe_call
from ._handlers import HandlersInBundle, HandlerWatch, handler_watch
from ._outgoing import CANCELLED, REFUSED, shutdown_error
from ._sessionevents import SessionEvents
from ._stdio import NO_WORK, freeze_heap_at_exit, lowlevel_server

logger = library_logger("trio_graceful.mcp")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

FINISH_BUDGET: Final = 0.25
"""Seconds a call cut off may take to write its error (as `serve_asgi`'s own)."""


def streamable_http_app(
    server: MCPServer | Server[Any],
    *,
    path: str = "/mcp",
    event_store: EventStore | None = None,
    retry_interval: float = 1.0,
    retry_after: int = 1,
) -> ASGIApp:
    """Return an ASGI app that serves ``server`` over Streamable HTTP and stops well.

    Serve it with `trio_graceful.asgi.serve_asgi` under `trio_graceful.run`
    (or ``python -m trio_graceful.asgi MODULE:APP``, with one worker: a
    session lives in one process)::

        app = trio_graceful.mcp.streamable_http_app(server)
        await runner.start_service(
            functools.partial(trio_graceful.asgi.serve_asgi, bind="0.0.0.0:8000"),
            app,
        )

    It is the SDK's own app (``server.streamable_http_app()``, at ``path``),
    with its sessions, security settings and routes, and these rules at STOP
    (and the drain delay before it, the health endpoint and the stop budget
    as for any app `trio_graceful.asgi.serve_asgi` serves):

    * Nothing new starts. A POST that would open a session is answered
      ``503`` with ``Retry-After: retry_after`` (and once the listeners have
      closed, connections are refused). A request that would start work in
      an open session (``tools/call``, ``resources/read``, ``prompts/get``,
      ``initialize``...) is answered at once with a JSON-RPC error, code
      -32000, *server is shutting down; the request was not started*.
      ``ping`` and the four lists are still answered, and a client's
      ``notifications/cancelled`` still cancels its call.
    * The calls in flight have until the cut-off to finish, and their
      answers go out on their streams.
    * Each standalone GET event stream ends at once with ``retry:
      retry_interval`` (SEP-1699): the client reconnects, to another
      replica. With an ``event_store`` it resumes with ``Last-Event-ID``
      (on another replica, in a new session: a session lives in one
      process; the replicas must share the store, see `open_event_store`).
    * At the cut-off each call still running is answered with a JSON-RPC
      error, code -32000, *server is shutting down; the call was cancelled
      before it finished*, before its stream ends with the terminating
      chunk, and its handler is cancelled. The sessions end with the app's
      lifespan, and a second signal is not held up by them.

    Each request that starts work has its handler run as a child of a
    bundle, *MCP calls*, named after the call, as under `serve_stdio`: a
    tool may call `trio_graceful.run_in_thread`, whose thread gets its stop
    flag at the server's STOP, or open an inbox on
    ``trio_graceful.current_bundle()`` to get STOP itself. The calls in
    flight are listed in the runner's ``/statusz`` (``"mcp calls at
    /mcp"``) and named in the ``trio_graceful.mcp`` log at STOP.

    The app must be served by `trio_graceful.asgi.serve_asgi`, whose drain
    it reads, and its lifespan may run once (the SDK's session manager runs
    once). Making it is not a checkpoint.

    Args:
        server (mcp.server.mcpserver.MCPServer or mcp.server.lowlevel.Server):
            The server, made with the SDK; its middleware list gets one more
            entry while the app's lifespan runs.
        path (str): Where the MCP endpoint is.
        event_store (mcp.server.streamable_http.EventStore or None): Where
            the events of each stream are kept, for clients that resume
            with ``Last-Event-ID``; None: streams cannot be resumed. Each
            session stores its streams under names of its own (its id, a
            space, the SDK's name), so that a replay sends the events of one
            session's stream only, in any store that replays one stream as
            the SDK's interface says.
        retry_interval (float): Seconds a client waits before it reconnects
            to an event stream that was ended (the ``retry:`` field; the SDK
            also puts it in each stream's first event when there is an
            ``event_store``). At least a millisecond.
        retry_after (int): Seconds in the ``Retry-After`` of a ``503``.

    Raises:
        TypeError: if ``server`` is not an SDK server.
        ValueError: if ``retry_interval`` is less than 0.001 or
            ``retry_after`` less than 1.
    """
    lowlevel = lowlevel_server(server)
    retry_interval = check_seconds("retry_interval", retry_interval)
    if retry_interval < 0.001:
        raise ValueError(
            f"retry_interval must be at least 0.001 seconds, not {retry_interval!r}"
        )
    check_count("retry_after", retry_after)
    freeze_heap_at_exit()
    retry_ms = round(retry_interval * 1000)
    sdk_app = server.streamable_http_app(
        streamable_http_path=path, event_store=event_store, retry_interval=retry_ms
    )
    manager = lowlevel.session_manager
    return _McpHttpApp(
        sdk_app,
        lowlevel,
        manager,
        _SdkSessions(manager, event_store),
        path,
        retry_ms,
        retry_after,
    )


@final
class _SdkSessions:
    """The session manager's sessions, where the SDK (``mcp`` 2.3.0) has no public way.

    The one place that reaches into the SDK's privates;
    tests/mcp/test_mcp_sdk_privates.py fails if one of them changes:

    * ``manager._server_instances``: the transport of each open session;
    * ``manager._admit_session(requestor)``: makes a new session's transport,
      with ``event_store=manager.event_store``, before anything is stored
      for the session (the first event is the priming event of the request
      that opens it);
    * ``transport._event_store``: where a transport stores its events.
    """

    __slots__ = ("_manager",)

    def __init__(
        self, manager: StreamableHTTPSessionManager, event_store: EventStore | None
    ) -> None:
        self._manager = manager
        if event_store is None:
            return
        admit = manager._admit_session  # pyright: ignore[reportPrivateUsage]

        def admit_with_view(
            requestor: AuthorizationContext | None,
        ) -> StreamableHTTPServerTransport | None:
            transport = admit(requestor)
            if transport is not None:
                _SdkSessions._give_view(transport, event_store)
            return transport

        manager._admit_session = admit_with_view  # type: ignore[method-assign]  # pyright: ignore[reportPrivateUsage]

    def transports(self) -> list[StreamableHTTPServerTransport]:
        """The transport of each open session. Not a checkpoint."""
        return list(self._manager._server_instances.values())  # pyright: ignore[reportPrivateUsage]

    @staticmethod
    def _give_view(transport: StreamableHTTPServerTransport, store: EventStore) -> None:
        """Make ``transport`` store its session's streams apart from the others'."""
        session = transport.mcp_session_id
        if session is None or transport._event_store is not store:  # pyright: ignore[reportPrivateUsage]
            # Refuse the session rather than mix its events with others' in a
            # replay.
            raise RuntimeError(
                "this mcp SDK makes a session's transport unlike mcp 2.3.0: "
                "its events cannot be kept apart from other sessions'"
            )
        transport._event_store = SessionEvents(store, session)  # pyright: ignore[reportPrivateUsage]


def _header(scope: Scope, name: str) -> str | None:
    key = name.encode("latin-1")
    for header, value in scope["headers"]:
        if header == key:
            return bytes(value).decode("latin-1")
    return None


async def _respond(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes = b""
) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _sse_event(message: JSONRPCMessage) -> bytes:
    """One event as the SDK frames it (``event: message``)."""
    data = message.model_dump_json(by_alias=True, exclude_unset=True)
    return f"event: message\r\ndata: {data}\r\n\r\n".encode()


async def _read_body(receive: Receive, limit: int) -> tuple[bytes, Receive]:
    """Read a request's body (up to ``limit`` bytes); a ``receive`` that replays it.

    A body over the limit is passed on unread past it: the SDK refuses it.
    """
    chunks: list[bytes] = []
    size = 0
    read: list[Message] = []
    while True:
        message = await receive()
        read.append(message)
        if message["type"] != "http.request":
            break
        chunk = bytes(message.get("body", b""))
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False) or size > limit:
            break

    async def replay() -> Message:
        if read:
            return read.pop(0)
        return await receive()

    return b"".join(chunks), replay


def _parse(body: bytes) -> JSONRPCMessage | None:
    try:
        return jsonrpc_message_adapter.validate_json(body, by_name=False)
    except ValueError:
        return None  # the SDK answers it


def _answers(chunk: bytes, request_id: RequestId) -> bool:
    """Whether an event-stream chunk carries the answer to ``request_id``."""
    for line in chunk.splitlines():
        if not line.startswith(b"data:") or not (
            b'"result"' in line or b'"error"' in line
        ):
            continue  # not an answer: a notification, the priming event
        message = _parse(line[5:].strip())
        if (
            isinstance(message, JSONRPCResponse | JSONRPCError)
            and message.id is not None
            and str(message.id) == str(request_id)
        ):
            return True
    return False


@final
class _StreamSend:
    """The ``send`` of one event stream: whether it started, and was answered."""

    __slots__ = ("_send", "answered", "answers", "started")

    def __init__(self, send: Send, answers: RequestId | None) -> None:
        self._send = send
        self.answers = answers
        self.started = False
        self.answered = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        elif (
            self.answers is not None
            and message["type"] == "http.response.body"
            and _answers(bytes(message.get("body", b"")), self.answers)
        ):
            self.answered = True
        await self._send(message)


async def _stop_calls(drain: Drain, calls: Bundle) -> None:
    """At the server's STOP, pass it on to the calls' threads and inboxes."""
    await drain.stopped.wait()
    names = sorted(task.name for task in calls.child_tasks)
    logger.info(
        "STOP: no new MCP work; %s",
        f"calls in flight: {', '.join(names)}" if names else "no call in flight",
    )
    await calls.shutdown(max(0.0, drain.deadline - trio.current_time()))


@final
class _McpHttpApp:
    """The SDK's Streamable HTTP app, told of STOP (see the module docstring)."""

    __slots__ = (
        "_lowlevel",
        "_manager",
        "_path",
        "_retry",
        "_retry_after",
        "_sdk",
        "_sessions",
    )

    def __init__(
        self,
        sdk: ASGIApp,
        lowlevel: Server[Any],
        manager: StreamableHTTPSessionManager,
        sessions: _SdkSessions,
        path: str,
        retry_ms: int,
        retry_after: int,
    ) -> None:
        self._sdk = sdk
        self._lowlevel = lowlevel
        self._manager = manager
        self._sessions = sessions
        self._path = path
        self._retry = f"retry: {retry_ms}\r\n\r\n".encode()
        self._retry_after = [(b"retry-after", str(retry_after).encode())]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection scope: the lifespan, or a request."""
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if scope["type"] != "http" or not self._is_endpoint(scope):
            await self._sdk(scope, receive, send)
            return
        drain = current_drain("streamable_http_app")
        if scope["method"] == "POST":
            await self._post(drain, scope, receive, send)
        elif scope["method"] == "GET" and _header(scope, LAST_EVENT_ID_HEADER) is None:
            await self._standalone_stream(drain, scope, receive, send)
        else:  # DELETE ends a session; a resumed stream may carry a call's answer
            await self._sdk(scope, receive, send)

    def _is_endpoint(self, scope: Scope) -> bool:
        path: str = scope["path"]
        root: str = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        return path == self._path

    # -- the lifespan ------------------------------------------------------------

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        drain = current_drain("streamable_http_app")

        async def receive_until_shutdown() -> Message:
            try:
                message = await receive()
            except BaseException:  # cancelled (the hard cancel): they end now
                await self._end_sessions()
                raise
            if message["type"] == "lifespan.shutdown":
                await self._end_sessions()
            return message

        async with (
            trio.open_nursery() as nursery,
            open_bundle(name="MCP calls") as calls,
        ):
            middleware = HandlersInBundle(calls, inline=NO_WORK)
            self._lowlevel.middleware.insert(0, middleware)
            nursery.start_soon(_stop_calls, drain, calls)
            try:
                with self._status_detail(calls):
                    await self._sdk(scope, receive_until_shutdown, send)
            finally:
                self._lowlevel.middleware.remove(middleware)
                nursery.cancel_scope.cancel(reason="the lifespan has ended")

    def _status_detail(self, calls: Bundle) -> contextlib.AbstractContextManager[None]:
        """The calls in flight in the runner's ``/statusz``, if there is a runner."""
        try:
            runner = current_runner()
        except RuntimeError:
            return contextlib.nullcontext()
        return runner.status_detail(
            f"mcp calls at {self._path}",
            lambda: sorted(task.name for task in calls.child_tasks),
        )

    async def _end_sessions(self) -> None:
        """Terminate every session's transport: its streams refuse writes at once."""
        transports = self._sessions.transports()
        with trio.CancelScope(shield=True):
            for transport in transports:
                await transport.terminate()
        if transports:
            logger.info("ended %d MCP sessions", len(transports))

    # -- POST: a message of the client ------------------------------------------

    async def _post(
        self, drain: Drain, scope: Scope, receive: Receive, send: Send
    ) -> None:
        body, receive = await _read_body(receive, self._manager.max_request_body_size)
        message = _parse(body)
        session = _header(scope, MCP_SESSION_ID_HEADER)
        if drain.stopped.is_set():
            if session is None:
                logger.info("refused a new MCP session: shutting down")
                await _respond(send, 503, self._retry_after)
                return
            if isinstance(message, JSONRPCRequest) and message.method not in NO_WORK:
                name = describe_call(message.method, message.params, message.id)
                logger.info("refused %s: shutting down", name)
                error = shutdown_error(message.id, REFUSED).message
                headers = [
                    (b"content-type", b"application/json"),
                    (MCP_SESSION_ID_HEADER.encode(), session.encode("latin-1")),
                ]
                await _respond(
                    send,
                    200,
                    headers,
                    error.model_dump_json(by_alias=True, exclude_unset=True).encode(),
                )
                return
        if not isinstance(message, JSONRPCRequest):
            await self._sdk(scope, receive, send)
            return
        await self._call(drain, message, scope, receive, send)

    async def _call(
        self,
        drain: Drain,
        request: JSONRPCRequest,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Pass a request on; answer it with an error if it is cut off."""
        watch = HandlerWatch()
        stream = _StreamSend(send, request.id)
        token = handler_watch.set(watch)
        try:
            await self._sdk(scope, receive, stream)
        except BaseException as exc:
            # Cancelled after STOP: the cut-off, or the hard cancel.
            if (
                is_cancellation(exc)
                and drain.stopped.is_set()
                and stream.started
                and not stream.answered
            ):
                await self._cut(drain, request, watch, send)
            raise
        finally:
            handler_watch.reset(token)

    async def _cut(
        self, drain: Drain, request: JSONRPCRequest, watch: HandlerWatch, send: Send
    ) -> None:
        name = describe_call(request.method, request.params, request.id)
        watch.cancel(f"{name} was cut off")
        error = shutdown_error(request.id, CANCELLED).message
        deadline = min(drain.deadline, trio.current_time() + FINISH_BUDGET)
        event = _sse_event(error)
        with (
            trio.CancelScope(shield=True, deadline=deadline),
            contextlib.suppress(Exception),  # the client has gone
        ):
            await send({"type": "http.response.body", "body": event, "more_body": True})
            logger.info("cut off %s: answered with an error", name)

    # -- GET: the session's standalone event stream -------------------------------

    async def _standalone_stream(
        self, drain: Drain, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Serve the stream until STOP, then end it with a ``retry:`` field."""
        stream = _StreamSend(send, None)
        if await drain.until_stop(self._sdk, (scope, receive, stream)) is not STOP:
            return
        if not stream.started:
            await _respond(send, 503, self._retry_after)
            return
        await send(
            {"type": "http.response.body", "body": self._retry, "more_body": True}
        )
        await send({"type": "http.response.body", "body": b"", "more_body": False})
