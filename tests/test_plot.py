"""Timeline plots of recorded traces."""

from __future__ import annotations

import io
import subprocess
import sys

import matplotlib
import pytest
import trio

from trio_graceful import Trace, open_bundle, plot_timeline, record_trace

from .examples_loader import EXAMPLES, load_example

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
    ax = plot_timeline(trace, title="a nested shutdown")
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
    ax = plot_timeline(trace)
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
    ax = plot_timeline(trace)
    try:
        ax.figure.canvas.draw()
        texts = sorted(ax.texts, key=lambda t: t.xy[0])
        assert [(t.get_text(), t.xy[0]) for t in texts] == [
            ("cancel: server", 1),
            ("hard cancel: server", pytest.approx(1.2)),
        ]
        renderer = ax.figure.canvas.get_renderer()
        first, second = (t.get_window_extent(renderer) for t in texts)
        assert not first.overlaps(second)
        # the second label moved down a lane, and the axes grew to hold it
        assert texts[1].xy[1] > texts[0].xy[1]
        assert ax.get_ylim()[0] > texts[1].xy[1]
    finally:
        plt.close(ax.figure)


def test_empty_trace_is_refused():
    with pytest.raises(ValueError, match=r"^the trace holds no events to plot$"):
        plot_timeline(Trace())


def test_the_plot_example_runs(tmp_path):
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "plot_nested_shutdown.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert result.stdout == "wrote nested_shutdown.png\n"
    assert (tmp_path / "nested_shutdown.png").read_bytes().startswith(b"\x89PNG")


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
