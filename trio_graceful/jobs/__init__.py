"""Durable background jobs on Trio: two-phase cancellation, deadlines, crash recovery.

Jobs live in a store (`open_store`); a `Worker` claims and runs them, each
in a bundle of its own, and settles every transition in the store together
with a row of the audit log. See the how-to "Durable background jobs".
"""

from .._exports import present_as_package as _present_as_package
from ._context import (
    CallTimeoutError as CallTimeoutError,
    JobContext as JobContext,
    JobStopped as JobStopped,
)
from ._functions import JobFunction as JobFunction
from ._leases import WorkerReplacedError as WorkerReplacedError
from ._open import open_store as open_store
from ._outages import (
    StoreGoneError as StoreGoneError,
    StoreUnavailableError as StoreUnavailableError,
)
from ._records import AuditEvent as AuditEvent, JobRecord as JobRecord
from ._sql import LostJobError as LostJobError, StoreError as StoreError
from ._states import (
    TRANSITIONS as TRANSITIONS,
    IllegalJobTransitionError as IllegalJobTransitionError,
    JobEvent as JobEvent,
    JobNotFoundError as JobNotFoundError,
    JobState as JobState,
)
from ._store import JobStore as JobStore
from ._worker import Worker as Worker, WorkerStatistics as WorkerStatistics

# Where each public name is really defined; the documentation build needs it
# to find the docstrings of attributes in the source.
_defined_in: dict[str, str] = _present_as_package(globals(), __name__)
del _present_as_package
