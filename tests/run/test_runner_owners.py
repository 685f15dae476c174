"""One owner for each of the runner's facts, and no import circle in its layer.

`run`'s options are defined once, in ``RunOptions``: `run`'s signature,
`add_run_arguments`, `run_arguments` and `RunArguments` must agree with it.
The stop time is one sum, ``StopTimes.time_left``: the stop budget, the
watchdog's deadlines and what the probes tell systemd come from it. The
program's parts report through callbacks, so none of them imports the
program.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import math
import signal
import time
import typing
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

import trio_graceful
from trio_graceful import ExitCodes, LifecycleState, ProgramStatus, RunArguments
from trio_graceful._run._exit._watchdog import Watchdog
from trio_graceful._run._options import _runoptions
from trio_graceful._run._options._runoptions import DEFAULT_OPTIONS, RunOptions
from trio_graceful._run._program._mainrun import MainEvents, MainRun
from trio_graceful._run._program._probes import time_left
from trio_graceful._run._shutdown._stoptime import WATCHDOG_MARGIN, Part, StopTimes
from trio_graceful._run._signals._escalation import Escalation

# -- the options --------------------------------------------------------------------


def command_line_names() -> list[str]:
    return [f.name for f in _runoptions.command_line_fields()]


def test_runs_keywords_are_the_options_fields_with_their_defaults():
    parameters = list(inspect.signature(trio_graceful.run).parameters.values())
    keywords = [p for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]
    fields = attrs.fields(RunOptions)
    assert [p.name for p in keywords] == [f.name for f in fields]
    for parameter in keywords:
        assert parameter.default is getattr(DEFAULT_OPTIONS, parameter.name)
    assert (DEFAULT_OPTIONS.grace, DEFAULT_OPTIONS.unwind_budget) == (10.0, 3.0)
    assert DEFAULT_OPTIONS.signals == (signal.SIGINT, signal.SIGTERM)
    assert DEFAULT_OPTIONS.exit_codes == ExitCodes()


def test_the_command_line_takes_its_options_and_defaults_from_the_class():
    assert command_line_names() == [
        "grace",
        "unwind_budget",
        "drain_delay",
        "stop_budget",
        "health_port",
        "health_host",
        "health_max_connections",
    ]
    parser = argparse.ArgumentParser()
    trio_graceful.add_run_arguments(parser)
    defaults = vars(parser.parse_args([]))
    assert defaults == {
        name: getattr(DEFAULT_OPTIONS, name) for name in command_line_names()
    }
    assert trio_graceful.run_arguments(parser.parse_args([])) == defaults
    signature = inspect.signature(trio_graceful.add_run_arguments).parameters
    assert signature["grace"].default is DEFAULT_OPTIONS.grace
    assert signature["unwind_budget"].default is DEFAULT_OPTIONS.unwind_budget


def test_run_arguments_is_typed_as_the_class_types_its_fields():
    attrs.resolve_types(RunOptions)
    types = {f.name: f.type for f in _runoptions.command_line_fields()}
    assert typing.get_type_hints(RunArguments) == types


@pytest.mark.parametrize(
    ("argv", "option", "value"),
    [
        (["--grace", "-1"], "grace", -1.0),
        (["--health-max-connections", "0"], "health_max_connections", 0),
        (["--stop-budget", "nan"], "stop_budget", math.nan),
    ],
)
def test_the_command_line_refuses_what_the_class_refuses(capsys, argv, option, value):
    with pytest.raises(ValueError, match=rf"^{option} must be >= "):
        RunOptions(**{option: value})
    parser = argparse.ArgumentParser(prog="service")
    trio_graceful.add_run_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(argv)
    assert f"argument --{option.replace('_', '-')}: " in capsys.readouterr().err


@pytest.mark.parametrize(
    "option",
    ["grace", "unwind_budget", "startup_timeout", "drain_delay", "stop_budget"],
)
def test_each_duration_is_checked_under_its_own_name(option):
    with pytest.raises(ValueError, match=rf"^{option} must be >= 0, not -1$"):
        RunOptions(**{option: -1})
    assert getattr(RunOptions(**{option: 2}), option) == 2.0
    assert type(getattr(RunOptions(**{option: 2}), option)) is float
    assert getattr(RunOptions(**{option: 10**400}), option) == math.inf


def test_the_options_are_refused_in_the_class_before_anything_runs():
    with pytest.raises(
        ValueError, match=r"^health_host='::1' needs a health_port \(0 picks"
    ):
        RunOptions(health_host="::1")
    with pytest.raises(TypeError, match=r"^clock must be a trio.abc.Clock or None"):
        RunOptions(clock=object())  # type: ignore[arg-type]
    # Duplicates go; the order is kept.
    assert RunOptions(signals=[15, 2, 15]).signals == (15, 2)


# -- the stop time ------------------------------------------------------------------

TIMES = StopTimes(drain_delay=5, grace=30, unwind_budget=3)


def test_the_stop_time_is_what_is_left_of_a_part_and_the_parts_after_it():
    assert TIMES.time_left(Part.DRAIN_DELAY) == 38
    assert TIMES.time_left(Part.DRAIN_DELAY, 2.5) == 35.5
    assert TIMES.time_left(Part.GRACE) == 33
    assert TIMES.time_left(Part.GRACE, 10) == 13
    assert TIMES.time_left(Part.UNWIND) == 3
    assert TIMES.time_left(Part.UNWIND, 1) == 1
    assert (
        StopTimes(drain_delay=0, grace=math.inf, unwind_budget=3).time_left(Part.GRACE)
        == math.inf
    )
    # The stop budget checks the whole of it, with the emergency exit.
    assert TIMES.total == TIMES.time_left(Part.DRAIN_DELAY) + WATCHDOG_MARGIN == 40


def status(**leaving: object) -> ProgramStatus:
    fields: dict[str, object] = {
        "name": "p",
        "state": LifecycleState.SHUTTING_DOWN,
        "reason": "",
        "ready": False,
        "live": True,
        "drain_delay_left": None,
        "grace_left": None,
        "forced": False,
        "tasks_running": 1,
        "services_running": (),
    }
    return ProgramStatus(**{**fields, **leaving})  # type: ignore[arg-type]


def test_the_probes_tell_systemd_the_stop_time():
    assert time_left(TIMES, status(drain_delay_left=2.5)) == 35.5
    assert time_left(TIMES, status(grace_left=10.0)) == 13
    assert time_left(TIMES, status(grace_left=10.0, forced=True)) == 3
    assert time_left(TIMES, status()) == math.inf  # no grace limit


def test_the_watchdog_arms_the_stop_time():
    # Long enough that the armed watchdog never fires during the test.
    times = StopTimes(drain_delay=100, grace=200, unwind_budget=600)
    watchdog = Watchdog(
        times=times,
        signals=(),
        exit_codes=ExitCodes(),
        escalation=Escalation("force"),
    )
    watchdog.start()
    try:
        for arm, part in (
            (watchdog.withdrawal_began, Part.DRAIN_DELAY),
            (watchdog.hard_cancel_began, Part.UNWIND),
        ):
            before = time.monotonic()
            arm()
            after = time.monotonic()
            deadline = watchdog._deadline  # pyright: ignore[reportPrivateUsage]
            left = times.time_left(part)
            assert before + left <= deadline <= after + left
        # The earliest deadline is kept: the grace's is later than the unwind's.
        watchdog.shutdown_began()
        assert watchdog._deadline == deadline  # pyright: ignore[reportPrivateUsage]
    finally:
        watchdog.stop()


# -- main reports through callbacks ------------------------------------------------


def recording_events(seen: list[object]) -> MainEvents:
    return MainEvents(
        ready=lambda: seen.append(("ready", trio.current_time())),
        returned=lambda: seen.append(("returned", trio.current_time())),
        exited=lambda exc: seen.append(("exited", exc.code)),
        failed=lambda message, exc, startup: seen.append((message, exc, startup)),
        shutting_down=lambda: False,
    )


async def test_main_reports_its_startup_and_its_end_to_the_record(
    autojump_clock: trio.testing.MockClock,
):
    seen: list[object] = []

    async def main(*, task_status: trio.TaskStatus[None]) -> None:
        await trio.sleep(2)
        task_status.started()
        await trio.sleep(3)

    run = MainRun(
        main,
        (),
        takes_task_status=True,
        startup_timeout=5,
        events=recording_events(seen),
    )
    async with trio.open_nursery() as control, trio_graceful.open_bundle() as root:
        await run.start(root, control)
        assert run.ready
    assert seen == [("ready", 2.0), ("returned", 5.0)]


async def test_a_main_not_ready_in_time_fails_the_startup_through_the_record(
    autojump_clock: trio.testing.MockClock,
):
    seen: list[object] = []

    async def main(*, task_status: trio.TaskStatus[None]) -> None:
        await trio.sleep(10)

    run = MainRun(
        main,
        (),
        takes_task_status=True,
        startup_timeout=5,
        events=recording_events(seen),
    )
    async with trio.open_nursery() as control, trio_graceful.open_bundle() as root:
        control.start_soon(run.start, root, control)
        await trio.sleep(5)
        await trio.testing.wait_all_tasks_blocked()
        assert seen == [("startup failed: main was not ready within 5 s", None, True)]
        assert trio.current_time() == 5
        run.cancel_startup()
    assert not run.ready


# -- the layer's imports ------------------------------------------------------------

RUN = Path(trio_graceful.__file__).parent / "_run"


def module_of(path: Path) -> str:
    """The module at ``path``, named within ``_run``: ``_program._runner``."""
    return ".".join(path.relative_to(RUN).with_suffix("").parts)


def imports_of(path: Path) -> set[str]:
    """The modules of ``_run`` that ``path`` imports, TYPE_CHECKING included."""
    package = path.relative_to(RUN).parent.parts
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and 0 < node.level <= len(package) + 1
            and node.module
        ):
            base = package[: len(package) - node.level + 1]
            found.add(".".join((*base, node.module)))
    return found


MODULES = [path for path in RUN.rglob("_*.py") if path.name != "__init__.py"]


def test_no_part_of_the_program_imports_it():
    importers = {
        module_of(path) for path in MODULES if "_program._program" in imports_of(path)
    }
    assert importers == {"_program._runner"}


def test_the_runners_layer_has_no_import_circle():
    graph = {module_of(path): imports_of(path) for path in MODULES}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path, module))
        if module in done:
            return
        for imported in graph.get(module, set()):
            visit(imported, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())
