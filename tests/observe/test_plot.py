"""Timeline plots of recorded traces."""

from __future__ import annotations

import functools
import io
import json
import subprocess
import sys

import matplotlib
import pytest
import trio
import trio.testing
from hypothesis import given, strategies as st

from tests.support.examples import EXAMPLES, load_example
from trio_graceful import (
    Trace,
    TraceEvent,
    TraceKind,
    open_bundle,
    record_trace,
)
from trio_graceful._observe._plot import LANE_HEIGHT
from trio_graceful._observe._timeline import Row, place_labels, row_name, rows

matplotlib.use("Agg")

import matplotlib.pyplot as plt


async def record_nested_shutdown() -> Trace:
    async def request(work):
        await trio.sleep(work)

    async def connection(inbox):
        async with open_bundle(name="requests") as requests:
            requests.start_soon(request, 2, name="quick")
            requests.start_soon(request, 30, name="slow")
            await inbox.receive()
            await requests.shutdown(grace=20)

    with record_trace() as trace:
        async with open_bundle(name="server") as server:
            _, inbox = server.open_inbox()
            server.start_soon(connection, inbox, name="conn")
            server.start_soon(trio.sleep, 3, name="flush")
            await trio.sleep(5)
            await server.shutdown(grace=10)
    return trace


async def test_timeline_rows_bars_and_lines(autojump_clock):
    trace = await record_nested_shutdown()
    ax = trace.plot(title="a nested shutdown")
    try:
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert labels == ["conn", "    quick", "    slow", "flush"]
        # one bar per task: (start, length), coloured by outcome
        bars = [
            (tuple(c.get_paths()[0].vertices[0]), tuple(c.get_facecolor()[0][:3]))
            for c in ax.collections
        ]
        assert len(bars) == 4
        colours = [colour for _, colour in bars]
        finished = matplotlib.colors.to_rgb("#2e8b57")
        cancelled = matplotlib.colors.to_rgb("#d2691e")
        assert colours == [
            pytest.approx(cancelled),  # conn: its nested shutdown outlived the grace
            pytest.approx(finished),  # quick
            pytest.approx(cancelled),  # slow
            pytest.approx(finished),  # flush
        ]
        # STOP reached conn at 5 s
        markers = [line for line in ax.get_lines() if line.get_marker() == "v"]
        assert [(m.get_xdata()[0], m.get_ydata()[0]) for m in markers] == [(5, 0)]
        # vertical lines: both cancellations at 5, the hard cancel at 15,
        # the inner deadline (25) that the outer one beat
        texts = sorted(t.get_text() for t in ax.texts)
        assert texts == [
            "cancel: server (+1 more)",
            "deadline: requests",
            "hard cancel: server (+1 more)",
        ]
        vlines = sorted(
            line.get_xdata()[0] for line in ax.get_lines() if line.get_marker() != "v"
        )
        assert vlines == [5, 15, 25]
        assert ax.get_title() == "a nested shutdown"
        png = io.BytesIO()
        ax.figure.savefig(png, format="png")
        assert png.getvalue().startswith(b"\x89PNG")
    finally:
        plt.close(ax.figure)


async def test_trace_plot_draws_on_given_axes(autojump_clock):
    trace = await record_nested_shutdown()
    fig, ax = plt.subplots()
    try:
        assert trace.plot(ax=ax) is ax
        assert len(ax.collections) == 4
    finally:
        plt.close(fig)


async def test_rows_of_namesakes_are_in_number_order(autojump_clock):
    with record_trace() as trace:
        async with open_bundle(name="server") as server:
            for _ in range(11):
                server.start_soon(trio.sleep, 1, name="handler")
    ax = trace.plot()
    try:
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert labels == ["handler"] + [f"handler#{n}" for n in range(2, 12)]
    finally:
        plt.close(ax.figure)


async def test_labels_of_lines_close_together_do_not_overlap(autojump_clock):
    with record_trace() as trace:
        async with open_bundle(name="server") as server:
            server.start_soon(trio.sleep_forever, name="stuck")
            await trio.sleep(1)
            await server.cancel(grace=0.2)
        await trio.sleep(20)
        async with open_bundle(name="later"):
            pass  # stretches the time axis to 21 s
    ax = trace.plot(title="close together")
    try:
        texts = sorted(ax.texts, key=lambda t: t.xy[0])
        assert [(t.get_text(), t.xy[0]) for t in texts] == [
            ("cancel: server", 1),
            ("hard cancel: server", pytest.approx(1.2)),
        ]
        # the second label went up a lane
        assert [t.get_position() for t in texts] == [
            (3, 0.5 * LANE_HEIGHT),
            (3, 1.5 * LANE_HEIGHT),
        ]
        # what the renderer draws agrees with the computed layout
        ax.figure.canvas.draw()
        renderer = ax.figure.canvas.get_renderer()
        first, second = (t.get_window_extent(renderer) for t in texts)
        assert not first.overlaps(second)
        # the title sits above both lanes
        title = ax.title.get_window_extent(renderer)
        assert not title.overlaps(first)
        assert not title.overlaps(second)
    finally:
        plt.close(ax.figure)


async def record_eight_parts() -> Trace:
    """Eight bundles cancelled 50 ms apart: many lines, labels in many lanes."""
    with record_trace() as trace:
        async with open_bundle(name="server") as server:
            for n in range(8):
                async with open_bundle(name=f"part-{n}") as part:
                    part.start_soon(trio.sleep_forever, name="stuck")
                    await trio.sleep(0.05)
                    await part.cancel(grace=0.01 * n)
            server.start_soon(trio.sleep, 30, name="long")
            await server.shutdown(grace=40)
    return trace


async def test_many_labels_never_overlap_when_drawn(autojump_clock):
    ax = (await record_eight_parts()).plot()
    try:
        ax.figure.canvas.draw()
        renderer = ax.figure.canvas.get_renderer()
        boxes = [t.get_window_extent(renderer) for t in ax.texts]
        assert len(boxes) == 16 + 2
        assert not [
            (a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :] if a.overlaps(b)
        ]
    finally:
        plt.close(ax.figure)


def assert_nothing_cut_off(figure, png, dpi):
    """Everything drawn lies inside the figure, and the image is the figure."""
    width, height = figure.get_size_inches() * dpi
    image = matplotlib.image.imread(io.BytesIO(png), format="png")
    assert image.shape[:2] == (int(height), int(width))
    (ax,) = figure.axes
    legend = ax.get_legend()
    assert legend is not None
    lanes = {t.get_position()[1] for t in ax.texts}
    assert len(lanes) >= 3  # labels in lanes above the axes
    drawn = [ax.title, ax.xaxis.label, legend, *ax.texts, *ax.get_yticklabels()]
    assert ax.title.get_text()
    assert ax.xaxis.label.get_text() == "seconds"
    inside = [
        figure.bbox.x0 <= box.x0
        and box.x1 <= figure.bbox.x1
        and figure.bbox.y0 <= box.y0
        and box.y1 <= figure.bbox.y1
        for box in (artist.get_window_extent() for artist in drawn)
    ]
    assert all(inside), [a for a, ok in zip(drawn, inside, strict=True) if not ok]
    everything = figure.get_tightbbox()  # inches
    size = figure.get_size_inches()
    assert everything.x0 >= 0
    assert everything.x1 <= size[0]
    assert everything.y0 >= 0
    assert everything.y1 <= size[1]


async def test_a_saved_timeline_cuts_nothing_off(autojump_clock, tmp_path):
    trace = await record_eight_parts()
    png = io.BytesIO()
    title = "eight parts cancelled 50 ms apart, then the server"
    figure = trace.save_plot(png, title=title, dpi=80)
    assert isinstance(figure, matplotlib.figure.Figure)
    assert plt.get_fignums() == []  # pyplot keeps nothing to close
    assert_nothing_cut_off(figure, png.getvalue(), dpi=80)
    # a path's extension gives the format; the method does the same
    figure = trace.save_plot(tmp_path / "timeline.png", title=title)
    assert_nothing_cut_off(figure, (tmp_path / "timeline.png").read_bytes(), dpi=100)
    figure = trace.save_plot(tmp_path / "timeline.svg")
    assert (tmp_path / "timeline.svg").read_text().startswith("<?xml")


async def test_a_plotted_timeline_saves_with_nothing_cut_off(autojump_clock):
    trace = await record_eight_parts()
    ax = trace.plot(title="eight parts")
    try:
        figure = ax.get_figure(root=True)
        assert isinstance(figure, matplotlib.figure.Figure)
        png = io.BytesIO()
        figure.savefig(png, format="png")  # plain: no bbox_inches="tight"
        assert_nothing_cut_off(figure, png.getvalue(), dpi=figure.dpi)
    finally:
        plt.close(ax.figure)


@given(
    st.lists(
        st.tuples(
            st.floats(0, 500, allow_nan=False), st.floats(1, 200, allow_nan=False)
        ),
        max_size=30,
    ),
    st.floats(0, 10, allow_nan=False),
)
def test_placed_labels_keep_apart_in_every_lane(anchors, gap):
    anchors.sort()
    placed = place_labels(anchors, limit=500, gap=gap)
    assert len(placed) == len(anchors)
    for (x, width), p in zip(anchors, placed, strict=True):
        assert p.right - p.left == pytest.approx(width)
        if p.align == "left":
            assert p.left == x + gap
        else:
            assert p.right == pytest.approx(x - gap)
            assert x + gap + width > 500  # only when it would run past the edge
        # the first lane where it fits: every lane below holds a clash
        for lane in range(p.lane):
            assert any(
                q.lane == lane and p.left < q.right + gap and q.left < p.right + gap
                for q in placed
            )
    for i, p in enumerate(placed):
        for q in placed[i + 1 :]:
            if p.lane == q.lane:
                assert p.right + gap <= q.left or q.right + gap <= p.left


# -- row names ---------------------------------------------------------------------


def test_row_names_say_what_the_user_named():
    assert [
        row_name(path, bundle)
        for path, bundle in [
            ("server/conn-1", "server"),
            ("server/handler#3", "server"),
            ("server/myapp.server.handle_client#2", "server"),
            ("server/tests.test_x.test_y.<locals>.worker", "server"),
            (
                "server/conns/trio._highlevel_serve_listeners._run_handler",
                "server/conns",
            ),
            (
                "server/conns/trio._highlevel_serve_listeners._run_handler#2",
                "server/conns",
            ),
            ("v1.2", ""),
            ("_private", ""),
            (
                "svc/connections/10.0.0.7:5000/requests/GET /a/b",
                "svc/connections/10.0.0.7:5000/requests",
            ),
            ("svc/requests/GET /work#2", "svc/requests"),
        ]
    ] == [
        "conn-1",
        "handler#3",
        "handle_client#2",
        "worker",
        "conns #1",
        "conns #2",
        "v1.2",
        "_private",
        "GET /a/b",
        "GET /work#2",
    ]


def test_a_row_named_with_slashes_is_as_deep_as_its_bundle_says():
    row = Row("svc/requests/GET /a/b", bundle="svc/requests")
    assert (row.name, row.depth) == ("GET /a/b", 2)


async def handle_client(stream):
    async with stream:
        await stream.receive_some()


class MemoryListener(trio.abc.Listener[trio.abc.Stream]):
    """Hands out the server ends of in-memory stream pairs, one per connect()."""

    def __init__(self):
        self._send, self._receive = trio.open_memory_channel[trio.abc.Stream](10)

    def connect(self):
        client, server = trio.testing.memory_stream_pair()
        self._send.send_nowait(server)
        return client

    async def accept(self):
        return await self._receive.receive()

    async def aclose(self):
        await trio.lowlevel.checkpoint()


async def test_rows_of_a_served_listener_are_named_after_the_bundle(autojump_clock):
    listeners = [MemoryListener()]
    with record_trace() as trace:
        async with (
            open_bundle(name="server") as server,
            open_bundle(name="connections") as connections,
        ):
            server.start_soon(
                functools.partial(
                    trio.serve_listeners,
                    handle_client,
                    listeners,
                    handler_nursery=connections,
                ),
                name="listener",
            )
            clients = [listeners[0].connect() for _ in range(2)]
            await trio.testing.wait_all_tasks_blocked()
            await connections.shutdown(grace=1)
            server.cancel_scope.cancel()
    assert len(clients) == 2
    assert [row.name for row in rows(trace.events)] == [
        "connections #1",
        "connections #2",
        "listener",
    ]
    assert "server/connections/trio._highlevel_serve_listeners._run_handler#2" in (
        trace.tasks()
    )
    ax = trace.plot()
    try:
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert labels == ["  connections #1", "  connections #2", "listener"]
    finally:
        plt.close(ax.figure)


# -- arguments -----------------------------------------------------------------


def test_arguments_are_checked_at_the_call():
    trace = Trace([TraceEvent(TraceKind.BUNDLE_OPENED, 0.0, "b")])
    with pytest.raises(TypeError, match=r"^title must be a string or None, not 5$"):
        trace.plot(title=5)  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"^ax must be a matplotlib Axes or None, not 5$"
    ):
        trace.plot(ax=5)  # type: ignore[arg-type]
    file = io.BytesIO()
    with pytest.raises(TypeError, match=r"^title must be a string or None, not 5$"):
        trace.save_plot(file, title=5)  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"^dpi must be a number of dots per inch, not '72'$"
    ):
        trace.save_plot(file, dpi="72")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^dpi must be >= 10 and finite, not 9.5$"):
        trace.save_plot(file, dpi=9.5)
    with pytest.raises(TypeError, match=r"^format must be a string or None, not 5$"):
        trace.save_plot(file, format=5)  # type: ignore[arg-type]
    assert file.getvalue() == b""
    assert plt.get_fignums() == []


def test_empty_trace_is_refused():
    with pytest.raises(ValueError, match=r"^the trace holds no events to plot$"):
        Trace().plot()
    with pytest.raises(ValueError, match=r"^the trace holds no events to plot$"):
        Trace().save_plot(io.BytesIO())


def test_the_plot_example_runs(tmp_path):
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "plot_nested_shutdown.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert result.stdout == "wrote nested_shutdown.png and nested_shutdown.json\n"
    assert (tmp_path / "nested_shutdown.png").read_bytes().startswith(b"\x89PNG")
    chrome = json.loads((tmp_path / "nested_shutdown.json").read_text())
    lives = [e for e in chrome["traceEvents"] if e["ph"] == "X"]
    assert len(lives) == 3 + 9 + 1  # connections, requests, flush


def test_the_plot_example_shows_which_deadline_won():
    example = load_example("plot_nested_shutdown")
    ax = example.draw(request_grace=5)
    try:
        texts = sorted(t.get_text() for t in ax.texts)
        # with a 5 s request grace the connections' own hard cancels strike
        # at 10 s, before the server's deadline at 15 s
        assert texts == [
            "cancel: server (+3 more)",
            "deadline: server",
            "hard cancel: requests (+2 more)",
        ]
    finally:
        plt.close(ax.figure)
