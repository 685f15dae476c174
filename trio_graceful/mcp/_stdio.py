"""`serve_stdio`: an MCP server made with the official SDK, under `trio_graceful.run`.

The SDK's own stdio transport reads stdin in a worker thread that no
cancellation reaches, so a server waiting for its next request cannot be
stopped while its client keeps the pipe open. Here the wire is read by
`trio_graceful.StdinLines` (no thread; the wait is a Trio checkpoint) and
written by a `LineWriter` (waits for room, cancellably), and the SDK's
low-level ``Server.run`` gets them as its two streams. Between the wire and
the SDK sits this module's `_Session`, which owns the stop:

1. until STOP (or the end of stdin, which asks the runner for a shutdown),
   every message is passed on and each request is recorded as a call in
   flight;
2. after STOP a request that starts work is answered at once with an error
   that says the server is shutting down; a request that starts none
   (`NO_WORK`: the lists and ``ping``) is still passed on and answered, and
   so is everything else (a client's ``notifications/cancelled``, answers
   to the server's own requests), so calls in flight can finish, or be
   cancelled;
3. when no call is in flight the session lingers (`LINGER`), if calls were
   in flight at STOP: a client that got a result may ask at once for a list
   (the SDK's client sends ``tools/list`` after a tool's result, to check
   it against the tool's output schema), and must get its answer, not a
   closed pipe. End of input ends the linger early;
4. then the SDK's input ends, the SDK returns, and so does `serve_stdio`.

At the interpreter's exit after a `serve_stdio`, `gc.freeze` runs first
(an ``atexit`` function): the interpreter's last garbage collection would
walk every object the SDK and pydantic made, a good part of a second on a
busy machine, and at exit nothing needs collecting.

The handlers run as children of the root bundle (`HandlersInBundle`), so
the runner's grace bounds them and its hard cancel ends them; the SDK then
answers each of them with an error, which goes out before the process ends.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import signal
from typing import Any, Final, cast, final

import anyio
import attrs
import trio
from anyio.streams.memory import MemoryObjectSendStream
from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.shared.jsonrpc_dispatcher import cancelled_request_id_from_params
from mcp.shared.message import SessionMessage
from mcp_types import (
    JSONRPCNotification,
    JSONRPCRequest,
    RequestId,
    jsonrpc_message_adapter,
)

from .._children._stdin import StdinLines, open_stdin_lines
from .._core._cancellation import PROGRESS_INTERVAL
from .._core._groups import is_cancellation
from .._core._inbox import InboxReceiver
from .._core._log import library_logger
from .._core._stop import STOP
from .._run._exit._status import ExitCodes
from .._run._program._runner import Runner, current_runner
from ._calls import CallsInFlight, describe_call
from ._descriptors import claim_stdio
from ._handlers import HandlersInBundle
from ._outgoing import REFUSED, WireOut, shutdown_error
from ._stdout import LineWriter

logger = library_logger("trio_graceful.mcp")

EXIT_CODES: Final = ExitCodes(clean_signals=frozenset({signal.SIGINT, signal.SIGTERM}))
"""`trio_graceful.run`'s exit statuses for an MCP server: 0 after a graceful stop.

An MCP client stops its server with SIGTERM or SIGINT (or by closing its
stdin); a server that then finishes its calls within the grace has done
what it was asked, so it exits with 0 after either signal. A stop that had to
be forced (the grace ran out, or a second signal came) exits with 128 + the
signal's number: 130 after SIGINT, 143 after SIGTERM.
"""


NO_WORK: Final = frozenset(
    {"ping", "tools/list", "prompts/list", "resources/list", "resources/templates/list"}
)
"""The requests still answered after STOP: they start no work.

They read what the server offers, and the SDK answers them from its
registries. Every other request is refused after STOP: ``tools/call``,
``resources/read``, ``prompts/get`` and ``completion/complete`` run the
server's own functions, for as long as those take; ``initialize``,
``logging/setLevel`` and ``resources/subscribe`` start a session or change
its state, which a stopping server will not keep.
"""

LINGER: Final = 0.5
"""Seconds the drain keeps answering `NO_WORK` requests after its last call.

Only if calls were in flight at STOP; ended early by the end of input (the
SDK's client closes the server's stdin when it is done), and never longer
than half the grace that is left, so that it never makes a graceful stop a
forced one.
"""


def lowlevel_server(server: MCPServer | Server[Any]) -> Server[Any]:
    if isinstance(server, MCPServer):
        # MCPServer has no public way to serve a pair of streams; the SDK's
        # own in-memory client reads this attribute too.
        lowlevel: Server[Any] = server._lowlevel_server  # pyright: ignore[reportPrivateUsage, reportUnknownMemberType]
        return lowlevel
    if not isinstance(cast("object", server), Server):
        raise TypeError(
            f"server must be an mcp MCPServer or a low-level mcp Server, not {server!r}"
        )
    return server


def freeze_heap_at_exit() -> None:
    """Run `gc.freeze` at the interpreter's exit, once however often this is called.

    The interpreter's last garbage collection would otherwise walk every
    object the SDK and pydantic made: a good part of a second on a busy
    machine, after the last answer has gone out (a second signal included).
    """
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


def _check_fds(fds: object) -> tuple[int, int] | None:
    if fds is None:
        return None
    if (
        isinstance(fds, tuple)
        and len(cast("tuple[object, ...]", fds)) == 2
        and all(
            isinstance(fd, int) and not isinstance(fd, bool) and fd >= 0
            for fd in cast("tuple[object, ...]", fds)
        )
    ):
        return cast("tuple[int, int]", fds)
    raise TypeError(
        f"fds must be None or a pair of file descriptors (read, write), not {fds!r}"
    )


async def serve_stdio(
    server: MCPServer | Server[Any],
    *,
    fds: tuple[int, int] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``server`` over stdio until a shutdown; for `trio_graceful.run`.

    Run it as the program's ``main``::

        sys.exit(trio_graceful.run(
            trio_graceful.mcp.serve_stdio, server,
            grace=10, exit_codes=trio_graceful.mcp.EXIT_CODES,
        ))

    It is ready (``task_status.started()``) once it reads requests. Then:

    * At the first SIGINT or SIGTERM (STOP) it starts no new work: each
      request that would (``tools/call``, ``resources/read``,
      ``prompts/get``, anything but the five below) is answered with a
      JSON-RPC error (code -32000, *server is shutting down; the request
      was not started*). Requests that start no work, ``tools/list``,
      ``prompts/list``, ``resources/list``, ``resources/templates/list``
      and ``ping``, are still answered. The calls in flight have the rest of
      the grace to finish, and their answers go out; a client's
      ``notifications/cancelled`` still cancels one. When none is left,
      `serve_stdio` returns; if calls were in flight at STOP, it first
      answers those five for another 0.5 s at most (half the grace left at
      most), or until the end of input: the SDK's client asks for
      ``tools/list`` right after a tool's result, to check the result.
    * End of input on stdin, or a stdout whose reader has gone, asks the
      runner for a graceful shutdown
      (`trio_graceful.Runner.request_shutdown`), which goes
      the same way and exits with status 0.
    * At the hard cancel (the grace ran out, or a second signal) each call
      still running is cancelled and answered with an error (*the call was
      cancelled before it finished*), if stdout can still be written.

    Each request's handler runs as a child of the runner's root bundle
    (`trio_graceful.Runner.root`), named after the call (``tools/call sleep (id 3)``): a
    tool may call `trio_graceful.run_in_thread` or
    `trio_graceful.run_process`, whose threads and processes then hear
    STOP and the hard cancel like any child, and may open an inbox on
    ``trio_graceful.current_bundle()`` to get STOP itself. A client's
    ``notifications/cancelled`` hard-cancels that handler, and nothing else.
    The ``trio_graceful.mcp`` logger names the calls in flight at STOP, every
    2 seconds while it waits for them, and at the hard cancel.

    While it serves, fd 0 reads ``/dev/null`` and fd 1 writes to stderr, as
    under the SDK's own stdio transport: a stray ``print()`` cannot corrupt
    the wire, and a subprocess cannot read the client's requests. The wire
    itself is read and written through private duplicates, with Trio
    waiting for it (no thread), and the descriptors' flags are never
    changed. At the interpreter's exit, the heap is frozen (`gc.freeze`)
    before the last garbage collection, which would otherwise walk every
    object the SDK made. This is a checkpoint.

    Args:
        server (mcp.server.mcpserver.MCPServer or mcp.server.lowlevel.Server):
            The server, made with the SDK; its middleware list gets one more
            entry while it is served.
        fds (tuple[int, int] or None): Serve these descriptors (read, write)
            instead of stdin and stdout, which are then left alone. They are
            not closed.
        task_status: Trio's, for `trio_graceful.run` or `trio.Nursery.start`.

    Raises:
        TypeError: if ``server`` is not an SDK server or ``fds`` not a pair of
            descriptors.
        RuntimeError: if not called from a task of `trio_graceful.run`.
        OSError: if stdin or stdout is not open.
    """
    lowlevel = lowlevel_server(server)
    checked_fds = _check_fds(fds)
    runner = current_runner()
    freeze_heap_at_exit()
    _, inbox = runner.root.open_inbox()
    middleware = HandlersInBundle(runner.root)
    with contextlib.ExitStack() as stack:
        read_fd, write_fd = (
            stack.enter_context(claim_stdio()) if checked_fds is None else checked_fds
        )
        lowlevel.middleware.insert(0, middleware)
        stack.callback(lowlevel.middleware.remove, middleware)
        to_sdk, from_wire = anyio.create_memory_object_stream[
            SessionMessage | Exception
        ]()
        calls = CallsInFlight()
        wire = WireOut(LineWriter(write_fd), calls, _stdout_broken)
        async with (
            open_stdin_lines(fd=read_fd) as lines,
            trio.open_nursery() as nursery,
        ):
            options = lowlevel.create_initialization_options()
            nursery.start_soon(lowlevel.run, from_wire, wire, options, name="mcp")
            task_status.started()
            async with to_sdk:  # its end ends the SDK's run
                await _Session(runner, inbox, lines, to_sdk, wire, calls).serve()


def _stdout_broken(why: str) -> None:
    logger.info("stdout closed (%s): shutting down", why)
    current_runner().request_shutdown("stdout closed")


@final
@attrs.define(eq=False)
class _Session:
    """The wire's messages on their way to the SDK, until the calls are done."""

    _runner: Runner
    _inbox: InboxReceiver[Any]
    _lines: StdinLines
    _to_sdk: MemoryObjectSendStream[SessionMessage | Exception]
    _wire: WireOut
    _calls: CallsInFlight

    async def serve(self) -> None:
        """Pass messages on until STOP or end of input, then finish the calls."""
        try:
            while True:
                line = await self._inbox.until_stop(self._next_line)
                if line is STOP:
                    logger.info("STOP: no new work; %s", self._calls.describe())
                    break
                if line is None:
                    logger.info("end of input; %s", self._calls.describe())
                    self._runner.request_shutdown("end of input")
                    break
                await self._take(line, accepting=True)
            await self._drain(linger=len(self._calls) > 0)
        except BaseException as exc:
            if is_cancellation(exc):
                logger.warning("hard cancel: %s", self._calls.describe())
            raise

    async def _next_line(self) -> bytes | None:
        try:
            return await self._lines.receive()
        except trio.EndOfChannel:
            return None

    async def _drain(self, *, linger: bool) -> None:
        """Wait for the calls in flight, answering only `NO_WORK` requests."""
        input_ended = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_while_draining, input_ended)
            await self._wait_for_calls()
            if linger:
                left = self._runner.status().grace_left
                with trio.move_on_after(
                    LINGER if left is None else min(LINGER, left / 2)
                ):
                    await input_ended.wait()
                await self._wait_for_calls()
            nursery.cancel_scope.cancel(reason="no call left in flight")
        await self._wait_for_calls()  # one passed on as the reading stopped

    async def _read_while_draining(self, input_ended: trio.Event) -> None:
        while (line := await self._next_line()) is not None:
            await self._take(line, accepting=False)
        input_ended.set()

    async def _wait_for_calls(self) -> None:
        while True:
            with trio.move_on_after(PROGRESS_INTERVAL):
                await self._calls.wait_empty()
                return
            left = self._runner.status().grace_left
            logger.info(
                "waiting for %s; %s",
                self._calls.describe(),
                "no time limit" if left is None else f"{left:.1f} s of grace left",
            )

    async def _take(self, line: bytes, *, accepting: bool) -> None:
        """Pass one line on to the SDK, or refuse the request it holds."""
        if not line.strip():
            return
        try:
            message = jsonrpc_message_adapter.validate_json(line, by_name=False)
        except ValueError as exc:
            await self._to_sdk.send(exc)  # the SDK decides, as from its own transport
            return
        request_id: RequestId | None = None
        if isinstance(message, JSONRPCRequest):
            if not accepting and message.method not in NO_WORK:
                name = describe_call(message.method, message.params, message.id)
                logger.info("refused %s: shutting down", name)
                with contextlib.suppress(anyio.BrokenResourceError):
                    await self._wire.send(shutdown_error(message.id, REFUSED))
                return
            request_id = message.id
            self._calls.start(message.method, message.params, request_id)
        try:
            await self._to_sdk.send(SessionMessage(message))
        except BaseException:
            if request_id is not None:  # not passed on: nobody will answer it
                self._calls.end(request_id)
            raise
        if (
            isinstance(message, JSONRPCNotification)
            and message.method == "notifications/cancelled"
        ):
            # The SDK cancels the handler and never answers the request.
            request_id = cancelled_request_id_from_params(message.params)
            cancelled = None if request_id is None else self._calls.end(request_id)
            if cancelled is not None:
                logger.info("the client cancelled %s", cancelled)
