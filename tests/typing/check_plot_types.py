"""Checked by mypy --strict and pyright --strict in CI, never run.

It pins the documented way to save a timeline (docs/observability.rst):
`save_timeline` and `Trace.save_plot` take a path or a binary file and
return a typed matplotlib Figure, with nothing for pyright to call unknown.
"""

from __future__ import annotations

import io
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from typing_extensions import assert_type

import trio_graceful


def save(trace: trio_graceful.Trace) -> None:
    trio_graceful.save_timeline(trace, "shutdown.png", title="shutdown")
    assert_type(trio_graceful.save_timeline(trace, Path("shutdown.svg")), Figure)
    assert_type(trace.save_plot("shutdown.png", dpi=150), Figure)
    assert_type(trace.save_plot(io.BytesIO(), format="png"), Figure)
    assert_type(trio_graceful.plot_timeline(trace, title="shutdown"), Axes)
    assert_type(trace.plot(), Axes)
