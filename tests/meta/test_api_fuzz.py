"""Every public callable, fed arbitrary values: a clear refusal or acceptance.

For each argument of each public callable, hypothesis draws values of every
kind (None, bools, huge and negative ints, NaN, infinities, Decimals,
strings, bytes, containers, plain objects) and passes them with the other
arguments valid. The outcome must be acceptance, or a `TypeError` or
`ValueError` raised at the call whose message names the argument; never
another exception (`OverflowError`, `AttributeError`, `IndexError`,
`KeyError`, an internal `AssertionError`, `trio.TrioInternalError`...), and
a refused call must have started nothing: no thread, no child, no run.

Where a case says which values are valid, the outcome must match exactly:
valid values accepted, the others refused. `run`, `run_process` and
`run_in_thread` are only fed values they must refuse, so that nothing real
ever runs.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Collection
from decimal import Decimal
from fractions import Fraction
from typing import Any

import attrs
import matplotlib
import pytest
import trio
import trio.testing
from hypothesis import given, settings, strategies as st

import trio_graceful
import trio_graceful.lowlevel
from trio_graceful import (
    AdmissionGate,
    Bundle,
    ExitCodes,
    HealthAnswer,
    InboxReceiver,
    ThreadBudget,
    Trace,
    TraceEvent,
    TraceKind,
    add_run_arguments,
    open_bundle,
    open_health_listeners,
    open_inbox,
    open_stdin_lines,
    run,
    run_arguments,
    run_asyncio,
    run_in_thread,
    run_process,
    serve_health,
)
from trio_graceful.lowlevel import add_trace_hook, remove_trace_hook

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup

matplotlib.use("Agg")

import matplotlib.pyplot as plt

ARBITRARY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([10**400, -(10**400), 2**33, 2**63, 2**31, -1, -200, 0, 1]),
    st.floats(),
    st.sampled_from(
        [Decimal("Infinity"), Decimal("NaN"), Decimal("-1"), Decimal("2.5")]
    ),
    st.just(Fraction(1, 3)),
    st.text(max_size=3),
    st.binary(max_size=3),
    st.builds(object),
    st.lists(st.integers(-3, 20), max_size=2),
    st.tuples(st.integers(-1, 1)),
    st.dictionaries(st.text(max_size=1), st.integers(), max_size=1),
)


def sync_function(*args: object) -> None:
    """A plain function where an async one is wanted."""


async def async_function(*args: object, **kwargs: object) -> None:
    """An async function where a plain one is wanted."""
    await trio.lowlevel.checkpoint()


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_seconds(value: object) -> bool:
    # huge and infinite graces must work everywhere a grace is accepted
    return is_number(value) and value >= 0  # type: ignore[operator]


def is_signal(value: object) -> bool:
    return is_integer(value) and value in signal.valid_signals()


def is_buffer_size(value: object) -> bool | None:
    if isinstance(value, Decimal) and value.is_infinite():
        return None  # Trio accepts it; refusing it is as good
    return value == math.inf or (is_integer(value) and value >= 0)  # type: ignore[operator]


def is_str_or_none(value: object) -> bool:
    return value is None or isinstance(value, str)


def is_signal_collection(value: object) -> bool:
    return (
        isinstance(value, Collection)
        and not isinstance(value, (str, bytes))
        and all(is_signal(s) for s in value)
    )


def is_command(value: object) -> bool:
    path = (str, bytes, os.PathLike)
    if isinstance(value, path):
        return True
    return (
        isinstance(value, (list, tuple))
        and len(value) > 0
        and all(isinstance(part, path) for part in value)
    )


@attrs.frozen
class Case:
    """One argument of one public callable."""

    argument: str
    call: Callable[[Any, Bundle | None], object]
    """Called with the value (and a fresh bundle for async calls); may return
    an awaitable, awaited in a child of that bundle."""
    valid: Callable[[object], bool | None] | None = None
    """Which values must be accepted (True) or refused (False); None: either."""
    only_invalid: bool = False
    """Feed only values that must be refused (accepting them would run
    something real)."""
    values: st.SearchStrategy[object] = ARBITRARY
    allowed: tuple[type[BaseException], ...] = ()
    """Documented errors besides TypeError and ValueError."""
    outside_trio: bool = False
    from_child: bool = False
    """Call from a child of the bundle, not from its body."""


def run_call(**kwargs: object) -> Callable[[object, Bundle | None], object]:
    """A call of `run` with one argument replaced; main must never run."""

    def call(value: object, _: Bundle | None) -> object:
        arguments: dict[str, object] = {
            "main": never_runs,
            "signals": (),
            "clock": trio.testing.MockClock(autojump_threshold=0),
        }
        arguments.update(dict.fromkeys(kwargs, value))
        main = arguments.pop("main")
        return run(main, **arguments)  # type: ignore[arg-type]

    return call


def is_port(value: object) -> bool:
    return is_integer(value) and 0 <= value <= 65535  # type: ignore[operator]


def health_listeners_opened(**kwargs: object) -> Callable[[object, object], object]:
    """Open health listeners with one argument replaced, and close them."""

    async def call(value: object, _: object) -> None:
        arguments: dict[str, object] = {"host": "127.0.0.1", "port": 0}
        arguments.update(dict.fromkeys(kwargs, value))
        for listener in await open_health_listeners(**arguments):  # type: ignore[arg-type]
            await listener.aclose()

    return call


def health_served(**kwargs: object) -> Callable[[object, object], object]:
    """Serve health probes on no listener with one argument replaced."""

    def call(value: object, _: object) -> object:
        def answer() -> HealthAnswer:
            return HealthAnswer(live=True, ready=True, status={})

        arguments: dict[str, object] = {"answer": answer}
        arguments.update(dict.fromkeys(kwargs, value))
        _, inbox = open_inbox()
        return serve_health(inbox, [], **arguments)  # type: ignore[arg-type]

    return call


async def never_runs() -> None:
    raise AssertionError("run() started main with an argument it should refuse")


async def ready(*, task_status: trio.TaskStatus[None]) -> None:
    task_status.started()


def after_signal(value: object, _: object) -> object:
    return ExitCodes().after_signal(value, forced=False)  # type: ignore[arg-type]


def draw(**kwargs: object) -> Callable[[object, object], object]:
    trace = Trace([TraceEvent(TraceKind.BUNDLE_OPENED, 0.0, "b")])

    def call(value: object, _: object) -> object:
        try:
            return trace.plot(**dict.fromkeys(kwargs, value))  # type: ignore[arg-type]
        finally:
            plt.close("all")

    return call


def save(**kwargs: object) -> Callable[[object, object], object]:
    trace = Trace([TraceEvent(TraceKind.BUNDLE_OPENED, 0.0, "b")])

    def call(value: object, _: object) -> object:
        arguments: dict[str, object] = {"file": io.BytesIO()}
        arguments.update(dict.fromkeys(kwargs, value))
        return trace.save_plot(**arguments)  # type: ignore[arg-type]

    return call


def is_dpi(value: object) -> bool:
    return is_number(value) and 10 <= value < math.inf  # type: ignore[operator]


def hook_added(value: object, _: object) -> None:
    add_trace_hook(value)  # type: ignore[arg-type]
    remove_trace_hook(value)  # type: ignore[arg-type]


async def bundle_opened(value: object, _: object) -> None:
    async with open_bundle(name=value):  # type: ignore[arg-type]
        pass


def stdin_opened(value: object, _: object) -> None:
    lines = open_stdin_lines(fd=value)  # type: ignore[arg-type]
    assert lines.fd == value


def on_stop(value: object, bundle: Bundle) -> None:
    with bundle.on_stop(value):  # type: ignore[arg-type]
        pass


def in_child(method: str) -> Callable[[object, Bundle], Awaitable[None]]:
    """Call a method that only a child of the bundle may call."""

    async def call(value: object, bundle: Bundle) -> None:
        getattr(bundle, method)(value)
        await trio.lowlevel.checkpoint()

    return call


def child_call(
    fn: Callable[..., Awaitable[object]], first: object, argument: str
) -> Callable[[object, Bundle], Awaitable[object]]:
    """Call ``fn(first, bundle=bundle)`` with ``argument`` replaced by the value.

    ``argument`` is a keyword, or ``"first"`` for the positional one.
    """

    def call(value: object, bundle: Bundle) -> Awaitable[object]:
        arguments: dict[str, object] = {"first": first, "bundle": bundle}
        arguments[argument] = value
        return fn(arguments.pop("first"), **arguments)

    return call


def child_cases(
    fn: Callable[..., Awaitable[object]],
    first: tuple[str, object, st.SearchStrategy[object], Callable[[object], bool]],
    keywords: dict[str, Callable[[object], bool]],
) -> dict[str, Case]:
    """Cases for a function that runs other work as a child of a bundle.

    Only values it must refuse are fed, from a child of the bundle: accepting
    one would start a thread, a process or an asyncio task.
    """
    name, default, values, valid = first
    cases = {
        f"{fn.__name__}/{name}": Case(
            name,
            child_call(fn, default, "first"),
            valid,
            values=values,
            only_invalid=True,
            from_child=True,
        )
    }
    for argument, is_valid in keywords.items():
        cases[f"{fn.__name__}/{argument}"] = Case(
            argument,
            child_call(fn, default, argument),
            is_valid,
            only_invalid=True,
            from_child=True,
        )
    return cases


def not_callable_or(*also: object) -> st.SearchStrategy[object]:
    return st.one_of(ARBITRARY.filter(lambda v: not callable(v)), st.sampled_from(also))


def instance_or_none(kind: type) -> Callable[[object], bool]:
    return lambda value: value is None or isinstance(value, kind)


CASES: dict[str, Case] = {
    "open_bundle/name": Case("name", bundle_opened, is_str_or_none),
    "open_inbox/max_buffer_size": Case(
        "max_buffer_size",
        lambda v, _: open_inbox(v),  # type: ignore[arg-type]
        is_buffer_size,
    ),
    "Bundle.open_inbox/max_buffer_size": Case(
        "max_buffer_size",
        lambda v, b: b.open_inbox(v),
        is_buffer_size,
    ),
    "Bundle.start_soon/async_fn": Case(
        "async_fn",
        lambda v, b: b.start_soon(v),
        lambda v: False,
        values=not_callable_or(sync_function),
    ),
    "Bundle.start_soon/name": Case(
        "name", lambda v, b: b.start_soon(async_function, name=v)
    ),
    "Bundle.start/async_fn": Case(
        "async_fn",
        lambda v, b: b.start(v),
        lambda v: False,
        values=not_callable_or(sync_function),
    ),
    "Bundle.start/name": Case("name", lambda v, b: b.start(ready, name=v)),
    "Bundle.cancel/grace": Case("grace", lambda v, b: b.cancel(v), is_seconds),
    "Bundle.shutdown/grace": Case("grace", lambda v, b: b.shutdown(v), is_seconds),
    "Bundle.on_stop/callback": Case(
        "callback", on_stop, callable, values=not_callable_or(sync_function)
    ),
    "Bundle.note/text": Case(
        "text", in_child("note"), lambda v: isinstance(v, str), from_child=True
    ),
    "Bundle.note_abandoned/what": Case(
        "what",
        in_child("note_abandoned"),
        lambda v: isinstance(v, str),
        from_child=True,
    ),
    "ThreadBudget/total_tokens": Case(
        "total_tokens",
        lambda v, _: ThreadBudget(v),  # type: ignore[arg-type]
        lambda v: is_integer(v) and v >= 1,  # type: ignore[operator]
    ),
    "AdmissionGate/quota": Case(
        "quota",
        lambda v, _: AdmissionGate(v),  # type: ignore[arg-type]
        lambda v: is_integer(v) and v >= 1,  # type: ignore[operator]
    ),
    "AdmissionGate/name": Case(
        "name",
        lambda v, _: AdmissionGate(1, name=v),  # type: ignore[arg-type]
        is_str_or_none,
    ),
    "ExitCodes.after_signal/signum": Case("signum", after_signal, is_signal),
    "add_trace_hook/hook": Case(
        "hook", hook_added, callable, values=not_callable_or(sync_function)
    ),
    "remove_trace_hook/hook": Case(
        "hook",
        lambda v, _: remove_trace_hook(v),  # type: ignore[arg-type]
        lambda v: False,
        values=ARBITRARY.filter(lambda v: not callable(v)),
    ),
    "Trace.plot/title": Case("title", draw(title=None), is_str_or_none),
    "Trace.plot/ax": Case("ax", draw(ax=None), lambda v: v is None),
    # matplotlib warns of a glyph missing from its font when it saves
    "Trace.save_plot/title": Case(
        "title", save(title=None), is_str_or_none, allowed=(UserWarning,)
    ),
    "Trace.save_plot/dpi": Case(
        "dpi",
        save(dpi=None),
        is_dpi,
        values=ARBITRARY.filter(lambda v: not is_number(v))
        | st.floats(-10, 150)
        | st.sampled_from([0, -1, 9.99, 10, math.inf]),
    ),
    "open_stdin_lines/fd": Case(
        "fd",
        stdin_opened,
        # an int that is no open descriptor raises OSError, as documented
        allowed=(OSError,),
    ),
    "run/main": Case(
        "main",
        run_call(main=None),
        lambda v: False,
        values=not_callable_or(sync_function),
        only_invalid=True,
        outside_trio=True,
    ),
    **{
        f"run/{argument}": Case(
            argument,
            run_call(**{argument: None}),
            valid,
            only_invalid=True,
            outside_trio=True,
        )
        for argument, valid in {
            "grace": is_seconds,
            "unwind_budget": is_seconds,
            "startup_timeout": is_seconds,
            "signals": is_signal_collection,
            "exit_codes": lambda v: isinstance(v, ExitCodes),
            "clock": instance_or_none(trio.abc.Clock),
            "name": is_str_or_none,
            "second_signal": lambda v: isinstance(v, str) and v in ("force", "exit"),
            "drain_delay": is_seconds,
            "stop_budget": is_seconds,
            "health_port": lambda v: v is None or is_port(v),
            # alone, even a string is refused: it needs a health_port
            "health_host": lambda v: v is None,
            "health_max_connections": lambda v: is_integer(v) and v >= 1,  # type: ignore[operator]
        }.items()
    },
    "add_run_arguments/parser": Case(
        "parser",
        lambda v, _: add_run_arguments(v),  # type: ignore[arg-type]
        lambda v: isinstance(v, argparse.ArgumentParser),
        outside_trio=True,
    ),
    **{
        f"add_run_arguments/{argument}": Case(
            argument,
            lambda v, _, argument=argument: add_run_arguments(
                argparse.ArgumentParser(), **{argument: v}
            ),
            is_seconds,
            outside_trio=True,
        )
        for argument in ("grace", "unwind_budget")
    },
    "run_arguments/args": Case(
        "args",
        lambda v, _: run_arguments(v),  # type: ignore[arg-type]
        lambda v: False,  # no fuzzed value was parsed by a prepared parser
        outside_trio=True,
    ),
    "open_health_listeners/port": Case(
        "port",
        health_listeners_opened(port=None),
        is_port,
        allowed=(OSError,),  # a port in use, or one that needs privileges
    ),
    "open_health_listeners/host": Case(
        "host",
        health_listeners_opened(host=None),
        # a string may name no host (refused), or fail to resolve (OSError)
        lambda v: True if v is None else (None if isinstance(v, str) else False),
        allowed=(OSError,),
    ),
    **{
        f"serve_health/{argument}": Case(
            argument,
            health_served(**{argument: None}),
            valid,
            only_invalid=True,
        )
        for argument, valid in {
            "answer": callable,
            "idle_timeout": is_seconds,
            "head_timeout": is_seconds,
            "max_connections": lambda v: is_integer(v) and v >= 1,  # type: ignore[operator]
            "max_header_bytes": lambda v: is_integer(v) and v >= 1,  # type: ignore[operator]
        }.items()
    },
    **child_cases(
        run_in_thread,
        ("sync_fn", sync_function, not_callable_or(async_function), callable),
        {
            "bundle": instance_or_none(Bundle),
            "name": is_str_or_none,
            "budget": instance_or_none(ThreadBudget),
            "gate": instance_or_none(AdmissionGate),
        },
    ),
    **child_cases(
        run_process,
        ("command", ["true"], ARBITRARY, is_command),
        {
            "bundle": instance_or_none(Bundle),
            "stop_signal": is_signal,
            "capture_stdout": lambda v: isinstance(v, bool),
            "capture_stderr": lambda v: isinstance(v, bool),
            "check": lambda v: isinstance(v, bool),
        },
    ),
    **child_cases(
        run_asyncio,
        ("aio_fn", async_function, not_callable_or(sync_function), callable),
        {
            "bundle": instance_or_none(Bundle),
            "inbox": instance_or_none(InboxReceiver),
        },
    ),
}

# Cases that fail today because a fix belongs to another part of the library
# and has not landed yet; each must fail (strict), so remove it once it passes.
NOT_YET_FIXED: set[str] = set()


@attrs.define
class Outcome:
    error: BaseException | None = None
    threads_before: int = 0
    threads_after: int = 0
    children_before: int = 0
    children_after: int = 0


def outcome_of(case: Case, value: object) -> Outcome:
    if case.outside_trio:
        outcome = Outcome(threads_before=threading.active_count())
        try:
            case.call(value, None)
        except BaseException as exc:
            outcome.error = exc
        outcome.threads_after = threading.active_count()
        return outcome
    return trio.run(
        in_a_bundle, case, value, clock=trio.testing.MockClock(autojump_threshold=0)
    )


async def in_a_bundle(case: Case, value: object) -> Outcome:
    outcome = Outcome()
    async with open_bundle(name="fuzz") as bundle:

        async def call() -> None:
            outcome.threads_before = threading.active_count()
            outcome.children_before = bundle.statistics().children_running
            try:
                result = case.call(value, bundle)
                if isinstance(result, Awaitable):
                    await result
            except BaseException as exc:
                outcome.error = exc
            outcome.threads_after = threading.active_count()
            outcome.children_after = bundle.statistics().children_running

        async def child(*, task_status: trio.TaskStatus[None]) -> None:
            task_status.started()
            await call()

        if case.from_child:
            await bundle.start(child, name="caller")
        else:
            await call()
        bundle.cancel_scope.cancel()
    return outcome


SIGNATURE_ERRORS = (
    "got multiple values for argument",
    "got an unexpected keyword argument",
    "positional argument",
)


def check(case: Case, value: object) -> None:
    valid = None if case.valid is None else case.valid(value)
    outcome = outcome_of(case, value)
    error = outcome.error
    if error is None:
        assert valid is not False, f"accepted {value!r}"
        return
    if isinstance(error, case.allowed) and valid is not False:
        return
    assert not isinstance(error, BaseExceptionGroup), error
    assert type(error) in (TypeError, ValueError), repr(error)
    assert case.argument in str(error), f"{case.argument!r} not named in {error}"
    # Python's own complaint about the call's shape is no check of the value
    assert not any(words in str(error) for words in SIGNATURE_ERRORS), error
    assert valid is not True, f"refused {value!r}: {error}"
    # refused before anything started
    assert outcome.threads_after <= outcome.threads_before
    assert outcome.children_after == outcome.children_before


def values_for(case: Case) -> st.SearchStrategy[object]:
    valid = case.valid
    if case.only_invalid and valid is not None:
        return case.values.filter(lambda v: valid(v) is False)
    return case.values


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            name,
            marks=pytest.mark.xfail(strict=True, reason="fix not merged yet")
            if name in NOT_YET_FIXED
            else (),
        )
        for name in CASES
    ],
)
@settings(max_examples=60)
@given(data=st.data())
def test_public_callables_refuse_bad_arguments_clearly(name: str, data: st.DataObject):
    case = CASES[name]
    check(case, data.draw(values_for(case), label=case.argument))


def test_every_public_callable_is_covered():
    covered = {name.split("/")[0].split(".")[0] for name in CASES}
    public = {
        name
        for package in (trio_graceful, trio_graceful.lowlevel)
        for name in dir(package)
        if not name.startswith("_")
        and callable(getattr(package, name))
        and not isinstance(getattr(package, name), type)
        and name != "TraceHook"  # a type alias
    }
    # these take no arguments
    assert public - covered == {"record_trace", "current_runner", "current_bundle"}
    assert {"Bundle", "ThreadBudget", "AdmissionGate", "ExitCodes"} <= covered
