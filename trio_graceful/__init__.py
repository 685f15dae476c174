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
    )
    from ._core._statetable import (
        IllegalTransitionError as IllegalTransitionError,
    )
    from ._core._stop import (
        STOP as STOP,
        StopType as StopType,
    )
    from ._core._trace import (
        TraceEvent as TraceEvent,
        TraceKind as TraceKind,
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
        record_trace as record_trace,
    )
    from ._run._exit._status import (
        ExitCodes as ExitCodes,
    )
    from ._run._options._arguments import (
        RunArguments as RunArguments,
        add_run_arguments as add_run_arguments,
        run_arguments as run_arguments,
    )
    from ._run._program._lifecycle import (
        Lifecycle as Lifecycle,
        LifecycleState as LifecycleState,
        StateUnreachableError as StateUnreachableError,
    )
    from ._run._program._programstatus import (
        ProgramStatus as ProgramStatus,
    )
    from ._run._program._runner import (
        Runner as Runner,
        current_runner as current_runner,
        run as run,
    )

# Each name of the block above is loaded on first use (see trio_graceful._exports).
if not TYPE_CHECKING:
    __getattr__, __dir__ = _lazy_names(globals())
del _lazy_names
