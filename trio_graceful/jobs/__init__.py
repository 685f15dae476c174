"""Durable background jobs on Trio: two-phase cancellation, deadlines, crash recovery.

Jobs live in a store (`open_store`); a `Worker` claims and runs them, each
in a bundle of its own, and settles every transition in the store together
with a row of the audit log. See the how-to "Durable background jobs".
"""

from typing import TYPE_CHECKING

from .._exports import lazy_names as _lazy_names

if TYPE_CHECKING:
    from ._context import JobContext as JobContext
    from ._exceptions import (
        CallTimeoutError as CallTimeoutError,
        IllegalJobTransitionError as IllegalJobTransitionError,
        JobNotFoundError as JobNotFoundError,
        JobStopped as JobStopped,
        LostJobError as LostJobError,
        StoreError as StoreError,
        StoreGoneError as StoreGoneError,
        StoreUnavailableError as StoreUnavailableError,
        WorkerReplacedError as WorkerReplacedError,
    )
    from ._functions import JobFunction as JobFunction
    from ._groupcommit import StoreStatistics as StoreStatistics
    from ._open import open_store as open_store
    from ._records import (
        AuditEvent as AuditEvent,
        JobRecord as JobRecord,
    )
    from ._states import (
        TRANSITIONS as TRANSITIONS,
        JobEvent as JobEvent,
        JobState as JobState,
    )
    from ._store import JobStore as JobStore
    from ._worker import (
        Worker as Worker,
        WorkerStatistics as WorkerStatistics,
    )

# Each name of the block above is loaded on first use (see trio_graceful._exports).
if not TYPE_CHECKING:
    __getattr__, __dir__ = _lazy_names(globals())
del _lazy_names
