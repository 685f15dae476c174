"""Trace events in the Chrome trace-event format, for Perfetto and chrome://tracing.

The format is JSON: ``{"traceEvents": [...]}``, each event with a name, a
phase (``ph``), a time stamp ``ts`` in microseconds, a process id and a
thread id. A task becomes a thread (named like its row on a plot, sorted in
the order of the tree of bundles), a child's life a complete event (``X``),
and STOP, cancellations, hard cancels and the rest instant events (``i``).
Events about a bundle rather than a task go on a first thread, ``bundles``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._core._jsonform import float_to_json
from .._core._trace import TraceEvent, TraceKind
from ._timeline import row_name, rows

_BUNDLES_TID = 0


def chrome_trace(
    events: Sequence[TraceEvent],
    *,
    wall_clock_offset: float | None,
    pid: int,
    process_name: str,
) -> dict[str, Any]:
    """Return ``events`` as a Chrome trace (see the module's docstring).

    Time stamps are wall-clock microseconds since the epoch when
    ``wall_clock_offset`` is known, else Trio time in microseconds.
    """
    offset = 0.0 if wall_clock_offset is None else wall_clock_offset

    def ts(time: float) -> float:
        return (time + offset) * 1e6

    timeline = rows(events)
    # One thread per path: the tasks that had it in turn are slices on it.
    tids: dict[str, int] = {}
    names: dict[str, str] = {}
    for row in timeline:
        if row.path not in tids:
            tids[row.path] = len(tids) + 1
            names[row.path] = row.name
    for event in events:
        if event.task is not None and event.task not in tids:
            tids[event.task] = len(tids) + 1
            names[event.task] = row_name(event.task, "")
    out: list[dict[str, Any]] = [
        _meta("process_name", pid, _BUNDLES_TID, {"name": process_name}),
        _meta("thread_name", pid, _BUNDLES_TID, {"name": "bundles"}),
        _meta("thread_sort_index", pid, _BUNDLES_TID, {"sort_index": 0}),
    ]
    for path, tid in tids.items():
        out.append(_meta("thread_name", pid, tid, {"name": names[path]}))
        out.append(_meta("thread_sort_index", pid, tid, {"sort_index": tid}))
    if events:
        first, last = events[0].time, events[-1].time
        for row in timeline:
            if row.start is None and row.end is None:
                continue  # only got STOP: its instant says it
            start = first if row.start is None else row.start
            end = last if row.end is None else row.end
            outcome = "still running" if row.outcome is None else row.outcome.value
            out.append(
                {
                    "name": row.name,
                    "cat": "child",
                    "ph": "X",
                    "ts": ts(start),
                    "dur": (end - start) * 1e6,
                    "pid": pid,
                    "tid": tids[row.path],
                    "args": {
                        "path": row.path,
                        "bundle": row.bundle,
                        "outcome": outcome,
                    },
                }
            )
    for event in events:
        if event.kind in (TraceKind.CHILD_STARTED, TraceKind.CHILD_ENDED):
            continue  # drawn as the child's complete event
        on_task = event.task is not None and event.kind in _ON_TASK
        args: dict[str, Any] = {"bundle": event.bundle}
        if event.task is not None:
            args["task"] = event.task
        if event.grace is not None:
            args["grace"] = float_to_json(event.grace)
        if event.deadline is not None:
            args["deadline_ts"] = float_to_json(ts(event.deadline))
        if event.detail is not None:
            args["detail"] = event.detail
        out.append(
            {
                "name": _name(event),
                "cat": "bundle",
                "ph": "i",
                "s": "t" if on_task else "p",
                "ts": ts(event.time),
                "pid": pid,
                "tid": tids[event.task] if on_task and event.task else _BUNDLES_TID,
                "args": args,
            }
        )
    return {"traceEvents": out, "displayTimeUnit": "ms"}


# Events that happen to one task, drawn on its thread; the others concern a
# whole bundle and are drawn across the process.
_ON_TASK = {TraceKind.STOP_SENT, TraceKind.STOP_RECEIVED}


def _name(event: TraceEvent) -> str:
    if event.kind in _ON_TASK:
        return event.kind.value
    if event.kind is TraceKind.STATE_CHANGED:
        return event.detail or event.kind.value
    return f"{event.kind.value}: {event.bundle}"


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": args}
