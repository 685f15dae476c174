"""The argument checks of the job store: what both databases can hold.

Every public operation checks its arguments here, in the Trio thread and
before anything is written, so that a bad value gets the same clear error
on SQLite and on PostgreSQL instead of whatever the driver makes of it
(an `OverflowError` on one, a ``NumericValueOutOfRange`` on the other).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Final, cast

import attrs

from .._core._checks import check_seconds
from ._exceptions import JobNotFoundError

# PostgreSQL's INTEGER, the narrower of the two stores' integer columns.
MAX_INT: Final = 2**31 - 1


def is_text(value: str) -> bool:
    """True if both stores can hold ``value``: no NUL, no lone surrogate."""
    if "\0" in value:
        return False
    if value.isascii():  # the common case, and no surrogate is ASCII
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def check_text(value: object, *, argument: str, empty: bool = False) -> str:
    """Return ``value`` if it is a string both stores can hold (empty if ``empty``).

    Raises:
        TypeError: if it is not a string.
        ValueError: if it is empty (unless ``empty``), or holds a NUL or a
            lone surrogate.
    """
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a string, not {value!r}")
    if not is_text(value):
        raise ValueError(
            f"{argument} must be text without NUL or lone surrogates, not {value!r}"
        )
    if not (value or empty):
        raise ValueError(f"{argument} must not be empty")
    return value


def check_kinds(kinds: object) -> tuple[str, ...] | None:
    """Return ``kinds`` as a sorted tuple of job kinds, or None for any kind.

    Raises:
        TypeError: if it is not a collection of strings (a string alone is not).
        ValueError: if it is empty or a kind is not valid text.
    """
    if kinds is None:
        return None
    if isinstance(kinds, str) or not isinstance(kinds, Collection):
        raise TypeError(
            f"kinds must be a collection of job kinds or None, not {kinds!r}"
        )
    if not kinds:
        raise ValueError("kinds must name at least one job kind, or be None for any")
    checked = {
        check_text(kind, argument="kind") for kind in cast("Iterable[object]", kinds)
    }
    return tuple(sorted(checked))


def check_job_id(job_id: object, *, argument: str = "job_id") -> str:
    """Return ``job_id`` if it is a string that can name a job.

    Raises:
        TypeError: if it is not a string.
        JobNotFoundError: if no job can have that id (the stores cannot
            even look it up).
    """
    if not isinstance(job_id, str):
        raise TypeError(f"{argument} must be a string, not {job_id!r}")
    if not is_text(job_id):
        raise JobNotFoundError(f"no job with id {job_id!r}")
    return job_id


def check_count(value: object, *, argument: str) -> int:
    """Return ``value`` if it is an int in ``1..MAX_INT``.

    Raises:
        TypeError: if it is not an int (`bool` is refused too).
        ValueError: if it is out of that range.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be an int, not {value!r}")
    if not 1 <= value <= MAX_INT:
        raise ValueError(f"{argument} must be in 1..{MAX_INT}, not {value!r}")
    return value


def check_at_least_one(value: object, *, argument: str) -> int:
    """Return ``value`` if it is an int >= 1.

    Raises:
        TypeError: if it is not an int (`bool` is refused too).
        ValueError: if it is less than 1.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be an int, not {value!r}")
    if value < 1:
        raise ValueError(f"{argument} must be >= 1, not {value!r}")
    return value


def check_duration(value: object, *, argument: str) -> float:
    """Return ``value`` as a float if it is a positive, finite number of seconds.

    Raises:
        TypeError: if it is not a number.
        ValueError: if it is zero, negative, infinite or NaN.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{argument} must be a number of seconds, not {value!r}")
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond any float
        seconds = math.inf
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"{argument} must be a finite number > 0, not {value!r}")
    return seconds


def check_timeout(value: object, *, argument: str = "timeout") -> float | None:
    """Return None, or ``value`` if it is a positive, finite number of seconds.

    Raises:
        TypeError, ValueError: as `check_duration`.
    """
    return None if value is None else check_duration(value, argument=argument)


def checked_as(
    check: Callable[..., object], **options: object
) -> Callable[[object, attrs.Attribute[Any], object], None]:
    """An attrs validator: ``check(value, argument=<the field's name>, **options)``.

    The message names the argument as the field does, with no second
    spelling of the name to drift from it.
    """

    def validate(
        instance: object, attribute: attrs.Attribute[Any], value: object
    ) -> None:
        del instance
        check(value, argument=attribute.name, **options)

    return validate


def seconds(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """An attrs validator: ``value`` is seconds >= 0 (`check_seconds`)."""
    del instance
    check_seconds(attribute.name, value)


def check_incarnation(incarnation: object) -> str | None:
    """Return ``incarnation`` if it is None or valid text."""
    if incarnation is None:
        return None
    return check_text(incarnation, argument="incarnation")


def claim_options(
    lease: object, stale_after: object, kinds: object, incarnation: object
) -> dict[str, Any]:
    """The checked options of a claim, as `_holding.claim_many` takes them."""
    return {
        "lease": check_duration(lease, argument="lease"),
        "stale_after": (
            None if stale_after is None else check_seconds("stale_after", stale_after)
        ),
        "kinds": check_kinds(kinds),
        "incarnation": check_incarnation(incarnation),
    }


# What a worker's transition may set beside the state; the store sets the rest.
_CHANGES: Final = ("elapsed", "error", "failed_subtasks", "progress", "result")


def check_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``changes`` keyed by the columns a worker's transition may set.

    The keys of the result are this module's own names, never the caller's
    objects: nothing from a caller reaches SQL as an identifier (a `str`
    subclass equal to a column's name, say).

    Raises:
        TypeError: naming the keyword arguments that are not such a column.
    """
    unknown = sorted(
        repr(name) if type(name) is not str else name
        for name in changes
        if type(name) is not str or name not in _CHANGES
    )
    if unknown:
        raise TypeError(
            f"a transition cannot set {', '.join(unknown)}; it sets only "
            f"{', '.join(_CHANGES)}"
        )
    return {column: changes[column] for column in _CHANGES if column in changes}
