"""Low-level hooks into trio_graceful, for tools built on top of it.

As `trio.lowlevel` holds Trio's instruments, this holds the hooks that see
every bundle and inbox of a run: a trace hook is called with each
`~trio_graceful.TraceEvent` as it happens. Most programs want
`trio_graceful.record_trace` instead, which keeps the events in a
`~trio_graceful.Trace` that can plot and export itself.
"""

from typing import TYPE_CHECKING

from .._exports import lazy_names as _lazy_names

if TYPE_CHECKING:
    from .._core._trace import (
        TraceHook as TraceHook,
        add_trace_hook as add_trace_hook,
        remove_trace_hook as remove_trace_hook,
    )

# Each name of the block above is loaded on first use (see trio_graceful._exports).
if not TYPE_CHECKING:
    __getattr__, __dir__ = _lazy_names(globals())
del _lazy_names
