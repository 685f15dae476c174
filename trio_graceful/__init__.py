"""Graceful, bounded and composable shutdown for Trio programs.

Hard cancellation (`trio.Cancelled`) is out of band and can strike at any
checkpoint. Graceful shutdown is in band: a `STOP` message that a task meets
where its own logic is consistent, followed by whatever shutdown work it needs.
A `Bundle` ties the two together: ``await bundle.cancel(grace)`` waits up to
``grace`` seconds for the children, then hard-cancels what is left.
"""

from ._children._admission import (
    AdmissionGate as AdmissionGate,
    AdmissionGateStatistics as AdmissionGateStatistics,
    BusyError as BusyError,
)
from ._children._aio import AsyncioInbox as AsyncioInbox, run_asyncio as run_asyncio
from ._children._process import run_process as run_process
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
from ._core._bundle import Bundle as Bundle
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
)
from ._core._stop import STOP as STOP, StopType as StopType
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
from ._exports import present_as_package as _present_as_package
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
from ._run._exitcodes import ExitCodes as ExitCodes
from ._run._lifecycle import (
    IllegalTransitionError as IllegalTransitionError,
    Lifecycle as Lifecycle,
    LifecycleState as LifecycleState,
    StateUnreachableError as StateUnreachableError,
)
from ._run._programstatus import ProgramStatus as ProgramStatus
from ._run._runner import (
    Runner as Runner,
    current_runner as current_runner,
    run as run,
)
from ._version import __version__ as __version__

# Where each public name is really defined; the documentation build needs it
# to find the docstrings of attributes in the source.
_defined_in: dict[str, str] = _present_as_package(globals(), __name__)
del _present_as_package
