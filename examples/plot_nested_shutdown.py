"""Draw a nested shutdown: the outer deadline wins.

A server with three connections is shut down with a 10 s grace. Each
connection, on STOP, shuts its requests down with a 20 s grace of its own.
The recorded trace, drawn as a timeline, shows the quick requests finishing,
the slow ones hard-cancelled when the *server's* deadline strikes, and the
connections' own 20 s deadlines still ahead, never reached.

Run it (on a virtual clock: instant) to get ``nested_shutdown.png``, and
``nested_shutdown.json`` to open at https://ui.perfetto.dev::

    python examples/plot_nested_shutdown.py

Needs the ``plot`` extra (matplotlib). Try: give the connections a 5 s grace
and watch their hard cancels come first.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import trio
import trio.testing

import trio_graceful

if TYPE_CHECKING:
    from matplotlib.axes import Axes


async def request(work: float) -> None:
    await trio.sleep(work)


async def connection(
    inbox: trio_graceful.InboxReceiver[object], request_grace: float
) -> None:
    async with trio_graceful.open_bundle(name="requests") as requests:
        for i, work in enumerate((2, 30, 4)):
            requests.start_soon(request, work, name=f"request-{i}")
        await inbox.receive()  # STOP
        await requests.shutdown(grace=request_grace)


async def main(request_grace: float = 20) -> trio_graceful.Trace:
    with trio_graceful.record_trace() as trace:
        async with trio_graceful.open_bundle(name="server") as server:
            for i in range(3):
                _, inbox = server.open_inbox()
                server.start_soon(connection, inbox, request_grace, name=f"conn-{i}")
            server.start_soon(trio.sleep, 3, name="flush")
            await trio.sleep(5)
            await server.shutdown(grace=10)
    return trace


def record(request_grace: float = 20) -> trio_graceful.Trace:
    return trio.run(
        main, request_grace, clock=trio.testing.MockClock(autojump_threshold=0)
    )


def draw(request_grace: float = 20) -> Axes:
    return record(request_grace).plot(title="server grace 10 s, request grace 20 s")


if __name__ == "__main__":
    trace = record()
    trace.save_plot(
        "nested_shutdown.png", title="server grace 10 s, request grace 20 s"
    )
    with open("nested_shutdown.json", "w") as file:
        json.dump(trace.to_chrome_trace(process_name="nested shutdown"), file)
    print("wrote nested_shutdown.png and nested_shutdown.json")
