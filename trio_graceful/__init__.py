"""Graceful, bounded and composable shutdown for Trio programs.

Hard cancellation (`trio.Cancelled`) is out of band and can strike at any
checkpoint. Graceful shutdown is in band: a `STOP` message that a task meets
where its own logic is consistent, followed by whatever shutdown work it needs.
A `Bundle` ties the two together: ``await bundle.cancel(grace)`` waits up to
``grace`` seconds for the children, then hard-cancels what is left.
"""

from ._bundle import Bundle as Bundle, open_bundle as open_bundle
from ._inbox import (
    InboxReceiver as InboxReceiver,
    InboxSender as InboxSender,
    InboxStatistics as InboxStatistics,
    open_inbox as open_inbox,
)
from ._plot import plot_timeline as plot_timeline
from ._report import (
    BundleStatistics as BundleStatistics,
    CancelReport as CancelReport,
    ChildEnd as ChildEnd,
    ChildOutcome as ChildOutcome,
)
from ._stop import STOP as STOP, StopType as StopType
from ._trace import (
    Trace as Trace,
    TraceEvent as TraceEvent,
    TraceHook as TraceHook,
    TraceKind as TraceKind,
    add_trace_hook as add_trace_hook,
    record_trace as record_trace,
    remove_trace_hook as remove_trace_hook,
)
from ._version import __version__ as __version__


def _fix_module_names() -> None:
    # Tracebacks, reprs and docs say trio_graceful.X, not trio_graceful._mod.X.
    for value in list(globals().values()):
        if getattr(value, "__module__", "").startswith(f"{__name__}._"):
            value.__module__ = __name__


_fix_module_names()
del _fix_module_names
