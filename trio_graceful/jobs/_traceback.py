"""A failed job's traceback as text the stores can hold, of bounded size.

A job's exception can carry anything: a message of megabytes, a NUL (which
PostgreSQL's text refuses), a lone surrogate (which neither store can
encode). The text keeps the start of the traceback (where the job was
called) and its end (the exception itself), and escapes what the stores
cannot hold.
"""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING, Final

from .._core._log import library_logger, plural

if TYPE_CHECKING:
    from ._records import JobRecord

logger = library_logger("trio_graceful.jobs")

#: Characters kept from the start and from the end of a longer traceback.
HEAD: Final = 2_000
TAIL: Final = 14_000


def traceback_text(exc: BaseException) -> str:
    """``exc``'s traceback, chained exceptions included, for the store."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    text = text.replace("\0", "\\x00")
    text = text.encode(errors="backslashreplace").decode()
    if len(text) > HEAD + TAIL:
        left_out = len(text) - HEAD - TAIL
        text = (
            f"{text[:HEAD]}\n[... {plural(left_out, 'character')} left out ...]\n"
            f"{text[-TAIL:]}"
        )
    return text


def report_failure(worker: str, job: JobRecord, why: str, exc: BaseException) -> str:
    """Log the failure of ``job`` at WARNING; return its traceback for the store."""
    logger.warning(
        "worker %s: job %s (%s) failed: %s", worker, job.id, job.kind, why, exc_info=exc
    )
    return traceback_text(exc)
