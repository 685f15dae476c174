"""Rolling restart: how many requests fail, with and without a drain delay.

A rolling restart simulated on loopback (``_rolling.py`` plays Kubernetes):
two replicas of ``examples/websocket_close_server.py`` behind a TCP proxy
that routes each new connection round-robin to the replicas *in rotation*,
polls their ``/readyz`` every 100 ms, and takes a terminated replica out of
rotation only once its readiness has failed *and* a propagation lag (1 s)
has passed since the SIGTERM, as an endpoint removal reaches the nodes late.
The replicas are restarted in turn (SIGTERM, wait for the exit within the
termination grace, SIGKILL if needed, start the replacement, add it once
ready) while clients of the ``websockets`` library pipeline requests through
the proxy the whole time (``_rolling_clients.py`` says exactly when a
request counts as failed, and when the client may safely send it again).

``--protocol http`` runs ``examples/asgi_service.py`` instead (Starlette on
``trio_graceful.asgi.serve_asgi``), with HTTP/1.1 keep-alive clients that
pipeline ``GET /work`` requests; its ``/readyz`` is probed on its own port.
A request unanswered when the replica closed the connection is sent again
only if the proxy says the replica had not received it
(``_rolling_clients.HttpFleet``).

Each drain delay is a scenario of its own: with a delay of at least the lag
the replica is still listening when the last connection reaches it; with no
delay it closes its listener at the SIGTERM while the proxy keeps sending
it new connections for a second.

Run ``python bench/bench_rolling_restart.py [--quick] [--restarts N]
[--drain-delay 0,1,2] [--lag S]``: it prints a table and the results as
JSON, and writes ``bench/results/rolling_restart.json`` (with the timeline
of every restart) and ``rolling_restart.rst`` (the tables the documentation
includes), or ``rolling_restart_http.*`` for HTTP; a ``--quick`` run writes
them only with ``--output-dir``.
``--render`` makes the tables again from the JSON.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import _common
import _render
import trio
from _rolling import KINDS, Orchestrator, Proxy, open_cluster
from _rolling_clients import ClientCounts, Fleet, HttpFleet

TITLE = "Rolling restart: failed requests with and without a drain delay"
RESULTS = Path(__file__).resolve().parent / "results"
UNWIND = 3.0
"""Seconds the orchestrator allows beyond the delay and the grace (the
runner's default unwind budget): its termination grace is their sum."""


class Sizes(NamedTuple):
    restarts: int
    clients: int
    min_ready: float
    """Seconds between a replacement's readiness and the next restart."""


FULL = Sizes(restarts=6, clients=8, min_ready=1.0)
QUICK = Sizes(restarts=2, clients=4, min_ready=0.2)

EVENTS = {
    "sigterm": "SIGTERM sent",
    "readiness_false": "readiness seen false by a probe",
    "stop": "STOP: the replica stops accepting (its log)",
    "removed": "taken out of rotation",
    "last_answer": "its last answer reaches a client",
    "exited": "the process has exited",
    "replacement_ready": "the replacement is ready and in rotation",
}
EXTRA_EVENTS = ("sigkill", "first_refused_connection")


async def rolling_restart(
    *,
    restarts: int,
    drain_delay: float,
    lag: float = 1.0,
    grace: float = 5.0,
    clients: int = 8,
    depth: int = 2,
    per_connection: int = 100,
    work_ms: tuple[int, int] = (10, 50),
    min_ready: float = 1.0,
    seed: int = 0,
    protocol: str = "websocket",
) -> dict[str, Any]:
    """Run one scenario: ``restarts`` restarts, the replicas in turn.

    ``protocol``: ``"websocket"`` (``examples/websocket_close_server.py``)
    or ``"http"`` (``examples/asgi_service.py``, HTTP/1.1 keep-alive clients).
    """
    server_args = ["--drain-delay", str(drain_delay), "--grace", str(grace)]
    if protocol == "websocket":
        # A replica that is shutting down refuses what it reads: the clients
        # send it to the other replica, instead of keeping this one busy to
        # the grace.
        server_args.append("--reject-during-drain")
    async with open_cluster(
        server_args,
        kind=KINDS[protocol],
        replicas=2,
        lag=lag,
        termination_grace=drain_delay + grace + UNWIND,
    ) as (orchestrator, proxy):
        fleet = _fleet(
            protocol,
            proxy,
            clients=clients,
            depth=depth,
            per_connection=per_connection,
            work_ms=work_ms,
            seed=seed,
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fleet.run)
            try:
                await fleet.warmed_up.wait()
                started = time.time()
                for number in range(restarts):
                    await orchestrator.restart(number % 2)
                    await trio.sleep(min_ready)  # Kubernetes' minReadySeconds
            finally:
                fleet.stop()
        duration = time.time() - started
    fleet.counts.check()
    return {
        "protocol": protocol,
        "drain_delay_s": drain_delay,
        "lag_s": lag,
        "restarts": restarts,
        "duration_s": duration,
        **fleet.counts.as_dict(),
        "unrouted_connections": proxy.unrouted,
        "timelines": timelines(orchestrator, fleet.counts),
    }


class _ThreadedFleet:
    """The WebSocket `Fleet` (asyncio, in a thread of its own), seen from Trio."""

    def __init__(self, fleet: Fleet) -> None:
        self.counts = fleet.counts
        self.stop = fleet.stop
        self._fleet = fleet
        self.warmed_up = self

    async def run(self) -> None:
        await trio.to_thread.run_sync(self._fleet.run)

    async def wait(self) -> None:
        await trio.to_thread.run_sync(
            self._fleet.warmed_up.wait, abandon_on_cancel=True
        )


def _fleet(protocol: str, proxy: Proxy, **sizes: Any) -> _ThreadedFleet | HttpFleet:
    if protocol == "http":
        return HttpFleet(proxy, **sizes)
    return _ThreadedFleet(
        Fleet(f"ws://127.0.0.1:{proxy.port}/", proxy.route_of, **sizes)
    )


def timelines(orchestrator: Orchestrator, counts: ClientCounts) -> list[dict[str, Any]]:
    """Each restart's events, in seconds from its SIGTERM, and its failures."""
    result = []
    starts = [r.events["sigterm"] for r in orchestrator.retired] + [time.time()]
    for old, new, end in zip(
        orchestrator.retired, orchestrator.replacements, starts[1:], strict=True
    ):
        t0 = old.events["sigterm"]
        at: dict[str, float | None] = {
            "sigterm": t0,
            "readiness_false": old.events.get("readiness_false"),
            "stop": old.logged_time(orchestrator.kind.stopped),
            "removed": old.events.get("removed"),
            "last_answer": counts.last_answer.get(old.name),
            "exited": old.events.get("exited"),
            "replacement_ready": new.events.get("added"),
            **{key: old.events[key] for key in EXTRA_EVENTS if key in old.events},
        }
        result.append(
            {
                "replica": old.name,
                "replacement": new.name,
                "events_s": {
                    key: None if value is None else value - t0
                    for key, value in at.items()
                },
                "refused_connections": old.refused_connections,
                "failed": sum(t0 <= t < end for t, _ in counts.failures),
            }
        )
    return result


def run(
    *,
    quick: bool = False,
    restarts: int | None = None,
    drain_delays: list[float] | None = None,
    lag: float = 1.0,
    clients: int | None = None,
    protocol: str = "websocket",
) -> dict[str, Any]:
    """Run every scenario; return the results as a JSON-ready dict."""
    sizes = (QUICK if quick else FULL)._replace(
        **{
            name: value
            for name, value in (("restarts", restarts), ("clients", clients))
            if value is not None
        }
    )
    for name in ("restarts", "clients"):
        if getattr(sizes, name) < 1:
            raise ValueError(f"{name} must be >= 1, not {getattr(sizes, name)}")
    delays = [0.0, lag, 2 * lag] if drain_delays is None else drain_delays
    load = _common.load_average()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    scenarios = []
    for delay in delays:
        print(f"drain delay {delay:g} s ...", file=sys.stderr, flush=True)
        scenario = functools.partial(
            rolling_restart,
            restarts=sizes.restarts,
            drain_delay=delay,
            lag=lag,
            clients=sizes.clients,
            min_ready=sizes.min_ready,
            protocol=protocol,
        )
        scenarios.append(trio.run(scenario))
    return {
        "title": TITLE,
        "machine": _common.machine(),
        "started": started,
        "settings": {"quick": quick, "protocol": protocol, **sizes._asdict()},
        "load_average": {"start": load, "end": _common.load_average()},
        "scenarios": scenarios,
    }


def _median_event(scenario: dict[str, Any], event: str) -> str:
    values = [t["events_s"].get(event) for t in scenario["timelines"]]
    known = [v for v in values if v is not None]
    return _common.fmt_seconds(statistics.median(known)) if known else "-"


COLUMNS = [
    "drain delay",
    "requests",
    "failed",
    "connection refused",
    "lost in flight",
    "retried",
    "SIGTERM → removed",
    "SIGTERM → STOP",
    "SIGTERM → exit",
]


def tables(result: dict[str, Any]) -> list[_common.Table]:
    """The scenarios side by side, and the timeline of one restart of each."""
    rows = [
        [
            f"{s['drain_delay_s']:g} s (lag {s['lag_s']:g} s)",
            f"{s['requests']:,}",
            f"{s['failed']:,}",
            f"{s['failed_connect']:,}",
            f"{s['failed_lost']:,}",
            f"{s['retried_refused']:,} / {s['retried_after_close']:,}",
            _median_event(s, "removed"),
            _median_event(s, "stop"),
            _median_event(s, "exited"),
        ]
        for s in result["scenarios"]
    ]
    first = result["scenarios"][0]
    protocol = _protocol(result)
    summary = _common.Table(
        title=TITLE if protocol == "websocket" else f"{TITLE}: HTTP/1.1 keep-alive",
        columns=COLUMNS,
        rows=rows,
        notes=[
            f"{first['restarts']} restarts per scenario, two replicas restarted in "
            f"turn; {result['settings']['clients']} clients pipelining through "
            "the proxy; times are medians over the restarts.",
            "A request fails when the client gives up on it; a retry is made "
            "only where the server's protocol says the request was not processed.",
            f"Retried: {RETRIED[protocol]}.",
        ],
    )
    timeline = _common.Table(
        title="Timeline of the first restart, in seconds from the SIGTERM",
        columns=[
            "event",
            *(f"delay {s['drain_delay_s']:g} s" for s in result["scenarios"]),
        ],
        rows=[
            [label, *(_event_cell(s, key) for s in result["scenarios"])]
            for key, label in EVENTS.items()
        ],
    )
    return [summary, timeline]


RETRIED = {
    "websocket": "refused / unanswered at the server's CLOSE 1001",
    "http": "answered 503 / sent as, or after, the replica closed the connection "
    "(the proxy counts what the replica had received)",
}


def _protocol(result: dict[str, Any]) -> str:
    return result["settings"].get("protocol", "websocket")


def _event_cell(scenario: dict[str, Any], event: str) -> str:
    value = scenario["timelines"][0]["events_s"].get(event)
    return "-" if value is None else f"{value:.3f}"


def goals(result: dict[str, Any]) -> list[_common.Goal]:
    """No failed request with a delay of at least the lag; failures without."""
    found = []
    what = "rolling restart" + ("" if _protocol(result) == "websocket" else " (HTTP)")
    for s in result["scenarios"]:
        covered = s["drain_delay_s"] >= s["lag_s"]
        found.append(
            _common.Goal(
                item=f"{what}, drain delay {s['drain_delay_s']:g} s, "
                f"lag {s['lag_s']:g} s",
                target="0 failed requests"
                if covered
                else "failed requests shown (the delay is shorter than the lag)",
                measured=f"{s['failed']:,} of {s['requests']:,} failed",
                met=s["failed"] == 0 if covered else s["failed"] > 0,
            )
        )
    return found


def render(results: dict[str, Any]) -> str:
    """The report in reStructuredText, written next to the JSON."""
    m = results["machine"]
    load = results["load_average"]
    measured = (
        f"Measured {results['started']} on {m['cpu']} ({m['logical_cpus']} logical "
        f"CPUs, shared with other work: load average {load['start'][0]} at the "
        f"start, {load['end'][0]} at the end), Python {m['python']}, Trio "
        f"{m['trio']}, websockets {m['websockets']}."
    )
    parts = [
        ".. This file is generated by bench/bench_rolling_restart.py from "
        f"{NAMES[_protocol(results)]}.json; do not edit it.\n",
        measured + "\n",
        *(
            _render.rst_table(t, underline="~")
            for t in [*tables(results), _render.goals_table(goals(results))]
        ),
    ]
    return "\n".join(parts)


def write(results: dict[str, Any], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    name = NAMES[_protocol(results)]
    (directory / f"{name}.json").write_text(json.dumps(results, indent=1) + "\n")
    (directory / f"{name}.rst").write_text(render(results))


NAMES = {"websocket": "rolling_restart", "http": "rolling_restart_http"}


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds >= 0, not {text!r}"
        )
    return value


def _delays(text: str) -> list[float]:
    return [_seconds(part) for part in text.split(",")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two restarts, 4 clients")
    parser.add_argument("--restarts", type=int, help="restarts per scenario")
    parser.add_argument("--clients", type=int, help="clients pipelining requests")
    parser.add_argument(
        "--drain-delay",
        type=_delays,
        help="comma-separated drain delays, one scenario each "
        "(default: 0, the lag, twice the lag)",
    )
    parser.add_argument("--lag", type=_seconds, default=1.0, help="seconds")
    parser.add_argument(
        "--protocol",
        choices=list(NAMES),
        default="websocket",
        help="websocket: examples/websocket_close_server.py; http: "
        "examples/asgi_service.py with HTTP/1.1 keep-alive clients (results in "
        "rolling_restart_http.json)",
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        help="where to write the results (default: bench/results, and nowhere "
        "for --quick, so that a quick run never replaces the full results)",
    )
    parser.add_argument("--render", type=Path, metavar="RESULTS_JSON")
    args = parser.parse_args(argv)
    if args.render is not None:
        results = _render.render_again(args.render, render)
    else:
        try:
            results = run(
                quick=args.quick,
                restarts=args.restarts,
                drain_delays=args.drain_delay,
                lag=args.lag,
                clients=args.clients,
                protocol=args.protocol,
            )
        except ValueError as exc:
            parser.error(str(exc))
        directory = args.output_dir or (None if args.quick else RESULTS)
        if directory is not None:
            write(results, directory)
        print(json.dumps(results, indent=1))
    for table in [*tables(results), _render.goals_table(goals(results))]:
        print(_render.markdown_table(table))


if __name__ == "__main__":
    main()
