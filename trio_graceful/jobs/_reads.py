"""Reading the job store: jobs by id or condition, and their audit rows.

The read-only part of `SqlQueries`, over its statements.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from ._exceptions import JobNotFoundError
from ._records import AuditEvent, JobRecord
from ._schema import COLUMNS, record
from ._states import JobState


class ReadQueries(abc.ABC):
    """The reading operations of `SqlQueries`."""

    order_column: str
    lock_row: str
    lock_rows: str

    @abc.abstractmethod
    def _execute(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """As `SqlQueries._execute`."""

    def _select(self, where: str, args: Sequence[Any]) -> list[JobRecord]:
        """The jobs matching ``where``, by id, locked as a claim locks them."""
        rows = self._execute(
            f"SELECT {COLUMNS} FROM jobs WHERE {where} ORDER BY id{self.lock_rows}",
            args,
        )
        return [record(row) for row in rows]

    def _get(self, job_id: str, *, lock: bool = False) -> JobRecord:
        rows = self._execute(
            f"SELECT {COLUMNS} FROM jobs WHERE id = ?"
            + (self.lock_row if lock else ""),
            (job_id,),
        )
        if not rows:
            raise JobNotFoundError(f"no job with id {job_id!r}")
        return record(rows[0])

    def get(self, job_id: str) -> JobRecord:
        return self._get(job_id)

    def jobs(self, ids: Sequence[str] | None) -> list[JobRecord]:
        if ids is None:
            rows = self._execute(
                f"SELECT {COLUMNS} FROM jobs ORDER BY created_at, {self.order_column}"
            )
            return [record(row) for row in rows]
        return [self._get(job_id) for job_id in ids]

    def events(self, job_id: str | None) -> list[AuditEvent]:
        query = "SELECT seq, job, source, target, at, worker, reason FROM job_events"
        args: tuple[str, ...] = ()
        if job_id is not None:
            query += " WHERE job = ?"
            args = (job_id,)
        rows = self._execute(query + " ORDER BY seq", args)
        if job_id is not None and not rows:
            self._get(job_id)  # every job has its submission's row
        return [
            AuditEvent(
                seq=row[0],
                job=row[1],
                source=None if row[2] is None else JobState(row[2]),
                target=JobState(row[3]),
                at=row[4],
                worker=row[5],
                reason=row[6],
            )
            for row in rows
        ]
