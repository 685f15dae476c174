"""Graceful, bounded and composable shutdown for Trio programs.

Hard cancellation (`trio.Cancelled`) is out of band and can strike at any
checkpoint. Graceful shutdown is in band: a `STOP` message that a task meets
where its own logic is consistent, followed by whatever shutdown work it needs.
A `Bundle` ties the two together: ``await bundle.cancel(grace)`` waits up to
``grace`` seconds for the children, then hard-cancels what is left.
"""

from typing import TYPE_CHECKING

from ._exports import lazy_names as _lazy_names
from ._version import __version__ as __version__

if TYPE_CHECKING:
    from ._children._admission import (
        AdmissionGate as AdmissionGate,
        AdmissionGateStatistics as AdmissionGateStatistics,
        BusyError as BusyError,
    )
    from ._children._aio import (
        AsyncioInbox as AsyncioInbox,
        run_asyncio as run_asyncio,
    )
    from ._children._process import (
        run_process as run_process,
    )
    from ._children._stdin import (
        StdinLines as StdinLines,
        open_stdin_lines as open_stdin_lines,
    )
    from ._children._threads import (
        StopFlag as StopFlag,
        ThreadBudget as ThreadBudget,
        ThreadBudgetStatistics as ThreadBudgetStatistics,
        run_in_thread as run_in_thread,
    )
    from ._core._bundle import (
        Bundle as Bundle,
    )
    from ._core._inbox import (
        InboxReceiver as InboxReceiver,
        InboxSender as InboxSender,
        InboxStatistics as InboxStatistics,
        open_inbox as open_inbox,
    )
    from ._core._openbundle import (
        current_bundle as current_bundle,
        open_bundle as open_bundle,
    )
    from ._core._report import (
        BundleStatistics as BundleStatistics,
        CancelReport as CancelReport,
        ChildEnd as ChildEnd,
        ChildOutcome as ChildOutcome,
        HardCancelCause as HardCancelCause,
    )
    from ._core._stop import (
        STOP as STOP,
        StopType as StopType,
    )
    from ._core._trace import (
        TraceEvent as TraceEvent,
        TraceHook as TraceHook,
        TraceKind as TraceKind,
        add_trace_hook as add_trace_hook,
        remove_trace_hook as remove_trace_hook,
    )
    from ._deploy._health import (
        HealthAnswer as HealthAnswer,
        HealthEndpoint as HealthEndpoint,
        HealthStatistics as HealthStatistics,
    )
    from ._deploy._healthserve import (
        open_health_listeners as open_health_listeners,
        serve_health as serve_health,
    )
    from ._observe._recording import (
        Trace as Trace,
        plot_timeline as plot_timeline,
        record_trace as record_trace,
        save_timeline as save_timeline,
    )
    from ._run._arguments import (
        RunArguments as RunArguments,
        add_run_arguments as add_run_arguments,
        run_arguments as run_arguments,
    )
    from ._run._exitcodes import (
        ExitCodes as ExitCodes,
    )
    from ._run._lifecycle import (
        IllegalTransitionError as IllegalTransitionError,
        Lifecycle as Lifecycle,
        LifecycleState as LifecycleState,
        StateUnreachableError as StateUnreachableError,
    )
    from ._run._programstatus import (
        ProgramStatus as ProgramStatus,
    )
    from ._run._runner import (
        Runner as Runner,
        current_runner as current_runner,
        run as run,
    )

__all__ = [
    "STOP",
    "AdmissionGate",
    "AdmissionGateStatistics",
    "AsyncioInbox",
    "Bundle",
    "BundleStatistics",
    "BusyError",
    "CancelReport",
    "ChildEnd",
    "ChildOutcome",
    "ExitCodes",
    "HardCancelCause",
    "HealthAnswer",
    "HealthEndpoint",
    "HealthStatistics",
    "IllegalTransitionError",
    "InboxReceiver",
    "InboxSender",
    "InboxStatistics",
    "Lifecycle",
    "LifecycleState",
    "ProgramStatus",
    "RunArguments",
    "Runner",
    "StateUnreachableError",
    "StdinLines",
    "StopFlag",
    "StopType",
    "ThreadBudget",
    "ThreadBudgetStatistics",
    "Trace",
    "TraceEvent",
    "TraceHook",
    "TraceKind",
    "__version__",
    "add_run_arguments",
    "add_trace_hook",
    "current_bundle",
    "current_runner",
    "open_bundle",
    "open_health_listeners",
    "open_inbox",
    "open_stdin_lines",
    "plot_timeline",
    "record_trace",
    "remove_trace_hook",
    "run",
    "run_arguments",
    "run_asyncio",
    "run_in_thread",
    "run_process",
    "save_timeline",
    "serve_health",
]

# Each name is loaded from its module on first use (see _exports).
_MODULES: dict[str, tuple[str, ...]] = {
    "._children._admission": ("AdmissionGate", "AdmissionGateStatistics", "BusyError"),
    "._children._aio": ("AsyncioInbox", "run_asyncio"),
    "._children._process": ("run_process",),
    "._children._stdin": ("StdinLines", "open_stdin_lines"),
    "._children._threads": (
        "StopFlag",
        "ThreadBudget",
        "ThreadBudgetStatistics",
        "run_in_thread",
    ),
    "._core._bundle": ("Bundle",),
    "._core._inbox": ("InboxReceiver", "InboxSender", "InboxStatistics", "open_inbox"),
    "._core._openbundle": ("current_bundle", "open_bundle"),
    "._core._report": (
        "BundleStatistics",
        "CancelReport",
        "ChildEnd",
        "ChildOutcome",
        "HardCancelCause",
    ),
    "._core._stop": ("STOP", "StopType"),
    "._core._trace": (
        "TraceEvent",
        "TraceHook",
        "TraceKind",
        "add_trace_hook",
        "remove_trace_hook",
    ),
    "._deploy._health": ("HealthAnswer", "HealthEndpoint", "HealthStatistics"),
    "._deploy._healthserve": ("open_health_listeners", "serve_health"),
    "._observe._recording": ("Trace", "plot_timeline", "record_trace", "save_timeline"),
    "._run._arguments": ("RunArguments", "add_run_arguments", "run_arguments"),
    "._run._exitcodes": ("ExitCodes",),
    "._run._lifecycle": (
        "IllegalTransitionError",
        "Lifecycle",
        "LifecycleState",
        "StateUnreachableError",
    ),
    "._run._programstatus": ("ProgramStatus",),
    "._run._runner": ("Runner", "current_runner", "run"),
}

if not TYPE_CHECKING:
    __getattr__, __dir__ = _lazy_names(globals(), __name__, _MODULES)
del _lazy_names
