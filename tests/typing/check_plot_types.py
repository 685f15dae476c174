"""Checked by mypy --strict and pyright --strict in CI, never run.

It pins the documented way to save a timeline (docs/observability.rst):
`Trace.save_plot` takes a path or a binary file and
returns a typed matplotlib Figure, with nothing for pyright to call unknown.
"""

from __future__ import annotations

import io
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from typing_extensions import assert_type

import trio_graceful


def save(trace: trio_graceful.Trace) -> None:
    trace.save_plot("shutdown.png", title="shutdown")
    assert_type(trace.save_plot(Path("shutdown.svg")), Figure)
    assert_type(trace.save_plot("shutdown.png", dpi=150), Figure)
    assert_type(trace.save_plot(io.BytesIO(), format="png"), Figure)
    assert_type(trace.plot(title="shutdown"), Axes)
    assert_type(trace.plot(), Axes)
