"""Admission gates: a small quota per endpoint that says "busy" instead of queueing.

A thread budget (`ThreadBudget`) bounds how many threads run at once, but a
burst of calls on one endpoint can still fill it with callers that queue for
the same lock, and starve every other endpoint. A gate in front of the
endpoint caps its share: while its quota is full, new callers are refused at
once (`BusyError`) and cost nothing, so the rest of the budget stays free for
the others. The refused caller answers "busy, retry later".
"""

from __future__ import annotations

from types import TracebackType
from typing import final

import attrs
import trio

from .._core._checks import check_count, check_name, field_check
from .._core._log import plural


class BusyError(trio.WouldBlock):
    """Raised when an `AdmissionGate`'s quota is full.

    It is a `trio.WouldBlock`, as for any ``*_nowait`` operation that cannot
    proceed: the caller was refused, not queued, and holds nothing.
    """


@attrs.frozen
class AdmissionGateStatistics:
    """A snapshot of an `AdmissionGate`, returned by `AdmissionGate.statistics`."""

    quota: int
    """How many callers the gate admits at once."""

    in_use: int
    """Callers admitted and not yet released."""

    peak_in_use: int
    """The most callers that were admitted at once."""

    admitted_total: int
    """Callers admitted since the gate was created."""

    rejected_total: int
    """Callers refused with `BusyError` since the gate was created."""


@final
@attrs.define(eq=False, repr=False)
class AdmissionGate:
    """A non-blocking gate that admits at most ``quota`` callers at once.

    Unlike a semaphore it never makes anyone wait: `acquire_nowait` either
    admits the caller or raises `BusyError` at once. Use it as a context
    manager around the work of one call::

        gate = trio_graceful.AdmissionGate(5, name="request_task")

        async def request_task(request):
            try:
                with gate:
                    return await handle(request)
            except trio_graceful.BusyError:
                return busy_response(retry_after=1)

    `run_in_thread` takes a gate too (``gate=``); it then holds the gate
    until its thread has really finished, so that even abandoned threads
    count against the endpoint's quota. Like Trio's synchronisation
    primitives, a gate belongs to one Trio run and is used from its tasks,
    not from other threads.

    Args:
        quota (int): How many callers may be inside at once (at least 1).
        name (str or None): A name for messages and reprs.

    Raises:
        TypeError: if ``quota`` is not an int or ``name`` not a string.
        ValueError: if ``quota`` is less than 1.
    """

    # Explicit aliases: type checkers do not all strip the underscore.
    _quota: int = attrs.field(alias="quota", validator=field_check(check_count))
    _name: str | None = attrs.field(
        alias="name", default=None, kw_only=True, validator=field_check(check_name)
    )
    _in_use: int = attrs.field(default=0, init=False)
    _peak_in_use: int = attrs.field(default=0, init=False)
    _admitted_total: int = attrs.field(default=0, init=False)
    _rejected_total: int = attrs.field(default=0, init=False)

    def __repr__(self) -> str:
        name = "" if self._name is None else f" {self._name!r}"
        return (
            f"<trio_graceful.AdmissionGate{name}, {self._in_use}/{self._quota} "
            f"in use at {id(self):#x}>"
        )

    @property
    def quota(self) -> int:
        """How many callers the gate admits at once."""
        return self._quota

    @property
    def name(self) -> str | None:
        """The gate's name, or `None`."""
        return self._name

    def acquire_nowait(self) -> None:
        """Take a place in the gate, or fail at once. Not a checkpoint.

        Every successful call must be matched by one `release`.

        Raises:
            BusyError: if ``quota`` callers are already inside.
        """
        if self._in_use >= self._quota:
            self._rejected_total += 1
            name = "" if self._name is None else f" {self._name!r}"
            raise BusyError(
                f"admission gate{name} is busy: every place is in use "
                f"({plural(self._quota, 'place')})"
            )
        self._in_use += 1
        self._admitted_total += 1
        self._peak_in_use = max(self._peak_in_use, self._in_use)

    def release(self) -> None:
        """Give back a place taken with `acquire_nowait`. Not a checkpoint.

        Raises:
            RuntimeError: if no place is taken.
        """
        if self._in_use == 0:
            raise RuntimeError(f"release() called on {self!r}, which nobody holds")
        self._in_use -= 1

    def __enter__(self) -> None:
        self.acquire_nowait()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()

    def statistics(self) -> AdmissionGateStatistics:
        """Return an `AdmissionGateStatistics` snapshot. Not a checkpoint."""
        return AdmissionGateStatistics(
            quota=self._quota,
            in_use=self._in_use,
            peak_in_use=self._peak_in_use,
            admitted_total=self._admitted_total,
            rejected_total=self._rejected_total,
        )
