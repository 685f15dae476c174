"""Looking at a run: recorded traces, timelines, plots and Chrome traces.

Built on `trio_graceful._core` only.
"""
