"""Recordings of trace events: keep them, plot them, export them.

`record_trace` keeps the events of a Trio run in a `Trace`, which can draw
itself (`Trace.plot`) or save its drawing (`Trace.save_plot`), write itself
as JSON and read itself back (`Trace.to_json`, `Trace.from_json`), and
export itself in the Chrome trace-event format (`Trace.to_chrome_trace`).

Events carry Trio times. A recording also takes, when it starts, the offset
from Trio's clock to the wall clock (``time.time() - trio.current_time()``);
the JSON and Chrome forms add it to give wall-clock times. Durations are the
same on both clocks; under a mock clock the wall-clock times are virtual too,
placed so that the start of the recording is the real moment it started.
"""

from __future__ import annotations

import math
import os
from collections.abc import Generator, Mapping
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

import attrs

from .._core._checks import check_name
from .._core._jsonform import (
    check_mapping,
    check_type,
    current_wall_clock_offset,
    dump_json,
    list_from_json,
    load_json_object,
    optional_float_from_json,
)
from .._core._trace import TraceEvent, TraceKind, add_trace_hook, remove_trace_hook
from ._chrome import chrome_trace
from ._plot import draw_timeline, save_figure, timeline_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


@attrs.define
class Trace:
    """The events recorded by `record_trace`, in the order they happened."""

    events: list[TraceEvent] = attrs.field(factory=list[TraceEvent])
    """Every event recorded."""

    wall_clock_offset: float | None = None
    """What to add to an event's Trio time to get its wall-clock time
    (seconds since the epoch), taken when the recording started; `None` if
    unknown."""

    def tasks(self) -> list[str]:
        """Return the paths of the tasks seen, in order of first appearance."""
        seen: dict[str, None] = {}
        for event in self.events:
            if event.task is not None:
                seen.setdefault(event.task, None)
        return list(seen)

    def of_kind(self, kind: TraceKind) -> list[TraceEvent]:
        """Return the events of one kind.

        Raises:
            TypeError: if ``kind`` is not a `TraceKind`.
        """
        check_type("kind", kind, (TraceKind,), "a TraceKind")
        return [e for e in self.events if e.kind is kind]

    def of_task(self, task: str) -> list[TraceEvent]:
        """Return the events about one task path.

        Raises:
            TypeError: if ``task`` is not a string.
        """
        check_type("task", task, (str,), "a task path (a string)")
        return [e for e in self.events if e.task == task]

    def plot(self, *, ax: Axes | None = None, title: str | None = None) -> Axes:
        """Draw the trace as a timeline, one row per task. Not a checkpoint.

        Each child's life is a bar coloured by how it ended (finished, hard-
        cancelled, raised; grey if still running when the recording stopped); a
        black triangle marks when STOP reached it. Vertical lines mark
        cancellations starting (dotted), hard deadlines set by them (dash-dot,
        also when the bundle finished first or an outer hard cancel struck
        first) and hard cancels (dashed red). Each line is labelled, above the
        plot, with the name of the outermost bundle concerned and how many more
        bundles it concerns; labels that would overlap go to lanes further up.
        Times are seconds since the first event.

        Rows are in the order of the tree of bundles, so nested bundles read as
        indented blocks. A row is named after what the user named: the task's
        name, or the name of the function it runs (``handle_client`` for
        ``myapp.handle_client``); a task running a library's private wrapper,
        such as the handlers `trio.serve_tcp` starts, is named after its bundle
        and its number there (``connections #2``).

        Args:
            ax: A matplotlib ``Axes`` to draw on; a new figure if `None`.
            title (str or None): The plot's title.

        Returns:
            The matplotlib ``Axes`` drawn on.

        Raises:
            ImportError: if matplotlib is not installed (install the ``plot``
                extra: ``pip install "trio-graceful[plot]"``).
            TypeError: if ``ax`` is not an ``Axes`` or ``title`` not a string.
            ValueError: if the trace holds no events.
        """
        check_name("title", title)
        if not self.events:
            raise ValueError("the trace holds no events to plot")
        return draw_timeline(self.events, ax=ax, title=title)

    def save_plot(
        self,
        file: str | os.PathLike[str] | IO[bytes],
        *,
        title: str | None = None,
        dpi: float = 100,
        format: str | None = None,
    ) -> Figure:
        """Draw the trace as a timeline and save it to ``file``. Not a checkpoint.

        The drawing is `plot`'s, on a new figure sized to what it
        holds: nothing is cut off, not the title, the lanes of line labels
        above the plot, the legend on its right, the row names or the x label.
        pyplot does not keep the figure, so nothing needs closing and no
        display is needed.

        Args:
            file (str, os.PathLike or typing.IO[bytes]): Where to save: a
                path, whose extension gives the format (``.png``, ``.svg``,
                ``.pdf``...), or a file opened for writing bytes.
            title (str or None): The plot's title.
            dpi (float): Dots per inch of a raster image.
            format (str or None): The format, if not the path's extension (PNG
                for a file object).

        Returns:
            matplotlib.figure.Figure: The figure saved.

        Raises:
            ImportError: if matplotlib is not installed (install the ``plot``
                extra: ``pip install "trio-graceful[plot]"``).
            TypeError: if ``title`` or ``format`` is not a string, or ``dpi``
                not a number.
            ValueError: if the trace holds no events, or ``dpi`` is less than
                10 or not finite; matplotlib's own errors for a format it
                does not know.
        """
        check_name("title", title)
        check_type("dpi", dpi, (int, float), "a number of dots per inch")
        if not 10 <= dpi < math.inf:  # fewer dots: fonts fail to render
            raise ValueError(f"dpi must be >= 10 and finite, not {dpi!r}")
        check_name("format", format)
        if not self.events:
            raise ValueError("the trace holds no events to plot")
        figure = timeline_figure(self.events, title=title)
        save_figure(figure, file, dpi=dpi, format=format)
        return figure

    def as_dict(self) -> dict[str, Any]:
        """Return the trace as a dictionary of JSON values.

        ``{"wall_clock_offset": ..., "events": [...]}``, each event as
        `TraceEvent.as_dict` gives it, with its wall-clock time. Not a
        checkpoint.
        """
        offset = self.wall_clock_offset
        return {
            "wall_clock_offset": offset,
            "events": [e.as_dict(wall_clock_offset=offset) for e in self.events],
        }

    def to_json(self, *, indent: int | None = None) -> str:
        """Return the trace as JSON text (see `as_dict`). Not a checkpoint.

        Raises:
            TypeError: if ``indent`` is not an int or None.
        """
        return dump_json(self.as_dict(), indent)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trace:
        """Rebuild a trace from `as_dict`'s output.

        Raises:
            TypeError: if ``data`` is not a mapping.
            ValueError: if a field is missing or holds the wrong kind of value.
        """
        data = check_mapping(data, "data")
        return cls(
            [TraceEvent.from_dict(e) for e in list_from_json(data, "events")],
            optional_float_from_json(data, "wall_clock_offset"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Trace:
        """Rebuild a trace from `to_json`'s output.

        Raises:
            TypeError: if ``text`` is not a str or bytes.
            ValueError: if it is not JSON of a trace.
        """
        return cls.from_dict(load_json_object(text))

    def to_chrome_trace(
        self, *, pid: int | None = None, process_name: str = "trio_graceful"
    ) -> dict[str, Any]:
        """Return the trace in the Chrome trace-event format, as JSON values.

        Write it with ``json.dump(trace.to_chrome_trace(), file)`` and open
        the file in https://ui.perfetto.dev or ``chrome://tracing``. Each task
        is a thread named like its row on a plot; each child's life is a
        complete event (``"X"``) whose arguments say how it ended; STOP,
        cancellations and hard cancels are instant events (``"i"``). Time
        stamps are wall-clock microseconds since the epoch (Trio time if
        `wall_clock_offset` is `None`). Not a checkpoint.

        Args:
            pid (int or None): The process id to show; this process's if None.
            process_name (str): The name to show for the process.

        Raises:
            TypeError: if ``pid`` is not an int or None, or ``process_name``
                is not a string.
        """
        check_type("pid", pid, (int, type(None)), "an int or None")
        check_type("process_name", process_name, (str,), "a string")
        return chrome_trace(
            self.events,
            wall_clock_offset=self.wall_clock_offset,
            pid=os.getpid() if pid is None else pid,
            process_name=process_name,
        )


@contextmanager
def record_trace() -> Generator[Trace, None, None]:
    """Record the trace events of the current Trio run while the block runs.

    Use it around a shutdown to explain it afterwards::

        with trio_graceful.record_trace() as trace:
            await bundle.shutdown(grace=10)
        for event in trace.events:
            print(event.time, event.kind.value, event.task)

    Not a checkpoint. Raises `RuntimeError` outside a Trio run.
    """
    trace = Trace()
    add_trace_hook(trace.events.append)
    trace.wall_clock_offset = current_wall_clock_offset()
    try:
        yield trace
    finally:
        remove_trace_hook(trace.events.append)
