"""An MCP server on the official SDK that stops well: Ctrl+C, SIGTERM, EOF.

The server is an ordinary ``MCPServer`` from the ``mcp`` SDK with three
tools; `trio_graceful.mcp.serve_stdio` serves it over stdio under
`trio_graceful.run`:

* ``sleep(seconds)``: waits on Trio and answers ``"slept <seconds>"``;
* ``blocking_sleep(seconds)``: the same wait as a blocking call in a worker
  thread (`trio_graceful.run_in_thread`, under a `trio_graceful.ThreadBudget`)
  that looks at its stop flag every 0.1 s and answers ``"stopped"`` as soon
  as it is told to stop;
* ``echo(text)``: answers ``text``.

Logs go to stderr; stdout carries JSON-RPC only. Run it with
``python examples/mcp_server.py [--grace S]`` (10 s by default) from an MCP
client (docs/mcp.rst shows how to connect the SDK's own), or by hand,
pasting JSON-RPC requests, one per line: ``initialize``, then
``tools/call`` with ``{"name": "sleep", "arguments": {"seconds": 5}}``.

Try:

* Ctrl+C while idle: it exits at once, with status 0.
* Ctrl+C during the ``sleep`` call: the call finishes, its answer is
  written, then the server exits with 0. A ``tools/call`` sent meanwhile is
  answered with *server is shutting down*; a ``tools/list`` or a ``ping``
  is answered as usual.
* ``--grace 2`` and a ``sleep`` of 30 s, then Ctrl+C: at 2 s the call is
  cancelled and answered with an error; the status is 130.
* ``blocking_sleep`` of 30 s, then Ctrl+C: the thread sees its stop flag
  and the call answers ``"stopped"`` at once.
* Ctrl+C twice: it exits at once. Ctrl+D (end of input): a graceful exit
  with status 0.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import trio
from mcp.server.mcpserver import MCPServer

import trio_graceful
import trio_graceful.mcp


def wait_blocking(stop: trio_graceful.StopFlag, seconds: float) -> str:
    """A blocking call that checks its stop flag every 0.1 s."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(0.1, left))  # stands for a blocking library call
        if stop.is_set():
            return "stopped"
    return f"slept {seconds}"


def build_server() -> MCPServer:
    """The MCP server and its tools: plain SDK code."""
    server = MCPServer("trio_graceful example")
    budget = trio_graceful.ThreadBudget(4)

    @server.tool()
    async def sleep(seconds: float) -> str:
        """Wait ``seconds`` on Trio."""
        await trio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool()
    async def blocking_sleep(seconds: float) -> str:
        """Wait ``seconds`` in a worker thread; stop early when told to."""
        return await trio_graceful.run_in_thread(wait_blocking, seconds, budget=budget)

    @server.tool()
    async def echo(text: str) -> str:
        """Answer ``text``."""
        return text

    return server


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, serve until stopped, return the exit status."""
    parser = argparse.ArgumentParser(description="An MCP server that stops well.")
    trio_graceful.add_run_arguments(parser, grace=10.0)
    args = parser.parse_args(argv)
    # Before the server exists: the SDK configures logging only if nobody has.
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(levelname)s %(name)s: %(message)s",
    )
    return trio_graceful.run(
        trio_graceful.mcp.serve_stdio,
        build_server(),
        exit_codes=trio_graceful.mcp.EXIT_CODES,
        name="mcp_server",
        **trio_graceful.run_arguments(args),
    )


if __name__ == "__main__":
    sys.exit(main())
