"""add_run_arguments and run_arguments: run's options on a command line."""

from __future__ import annotations

import argparse
import inspect
import math
import re

import pytest
import trio

import trio_graceful


def parser(**defaults: float) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="service")
    trio_graceful.add_run_arguments(parser, **defaults)
    return parser


def test_defaults_are_runs_own():
    args = parser().parse_args([])
    assert trio_graceful.run_arguments(args) == {
        "grace": 10.0,
        "unwind_budget": 3.0,
        "drain_delay": 0.0,
        "stop_budget": math.inf,
        "health_port": None,
        "health_host": None,
        "health_max_connections": 32,
    }
    signature = inspect.signature(trio_graceful.run).parameters
    for name, value in trio_graceful.run_arguments(args).items():
        assert signature[name].default == value, name


def test_every_option_reaches_run():
    argv = [
        "--grace=25",
        "--unwind-budget=1.5",
        "--drain-delay=5",
        "--stop-budget=inf",
        "--health-port=0",
        "--health-host=127.0.0.1",
        "--health-max-connections=5",
    ]
    options = trio_graceful.run_arguments(parser(grace=3).parse_args(argv))
    assert options == {
        "grace": 25.0,
        "unwind_budget": 1.5,
        "drain_delay": 5.0,
        "stop_budget": math.inf,
        "health_port": 0,
        "health_host": "127.0.0.1",
        "health_max_connections": 5,
    }
    seen: list[object] = []

    async def main() -> None:
        runner = trio_graceful.current_runner()
        assert runner.health_address is not None
        seen.extend([runner.grace, runner.drain_delay, runner.health_address[0]])

    assert trio_graceful.run(main, **options, signals=()) == 0
    assert seen == [25.0, 5.0, "127.0.0.1"]


def test_the_defaults_given_are_used():
    args = parser(grace=30, unwind_budget=0).parse_args([])
    assert (args.grace, args.unwind_budget) == (30.0, 0.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--grace", "-1"], "argument --grace: grace must be >= 0, not -1.0"),
        (["--grace", "nan"], "argument --grace: grace must be >= 0, not nan"),
        (
            ["--drain-delay", "soon"],
            "argument --drain-delay: drain_delay must be a number of seconds, "
            "not 'soon'",
        ),
        (
            ["--stop-budget", "-0.5"],
            "argument --stop-budget: stop_budget must be >= 0, not -0.5",
        ),
        (
            ["--unwind-budget", ""],
            "argument --unwind-budget: unwind_budget must be a number of "
            "seconds, not ''",
        ),
        (
            ["--health-port", "70000"],
            "argument --health-port: health_port must be a port number in "
            "0..65535, not '70000'",
        ),
        (
            ["--health-port", "x"],
            "argument --health-port: health_port must be a port number in "
            "0..65535, not 'x'",
        ),
        (
            ["--health-port=0", "--health-max-connections", "0"],
            "argument --health-max-connections: health_max_connections must be "
            "an int >= 1, not '0'",
        ),
        (
            ["--health-max-connections", "many"],
            "argument --health-max-connections: health_max_connections must be "
            "an int >= 1, not 'many'",
        ),
        (
            ["--health-host", "::1"],
            "argument --health-host: needs --health-port (--health-port=0 "
            "picks a free port)",
        ),
        (
            ["--health-host=::1", "--grace=1"],
            "argument --health-host: needs --health-port (--health-port=0 "
            "picks a free port)",
        ),
    ],
)
def test_bad_values_are_refused_by_the_parser(capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        parser().parse_args(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"service: error: {message}"


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: trio_graceful.add_run_arguments(None), TypeError, "parser must be"),  # type: ignore[arg-type]
        (
            lambda: trio_graceful.add_run_arguments(
                argparse.ArgumentParser(), grace=-1
            ),
            ValueError,
            "grace must be >= 0, not -1",
        ),
        (
            lambda: trio_graceful.add_run_arguments(
                argparse.ArgumentParser(), unwind_budget=math.nan
            ),
            ValueError,
            "unwind_budget must be >= 0, not nan",
        ),
    ],
)
def test_bad_defaults_are_refused_before_anything_is_added(call, error, message):
    with pytest.raises(error, match=f"^{message}"):
        call()


def test_bad_default_adds_nothing():
    parser = argparse.ArgumentParser()
    with pytest.raises(ValueError, match="grace"):
        trio_graceful.add_run_arguments(parser, grace=-1)
    assert parser.parse_args([]) == argparse.Namespace()


def test_a_health_host_with_a_port_in_any_order_is_accepted():
    for argv in (["--health-host=::1", "--health-port=0"], ["--health-port=0"]):
        args = parser().parse_args(argv)
        assert args.health_port == 0
    args, extras = parser().parse_known_args(["--health-port=1", "--other"])
    assert (args.health_port, extras) == (1, ["--other"])


def test_a_health_host_without_a_port_is_still_refused_by_run():
    options = trio_graceful.run_arguments(parser().parse_args([]))
    options["health_host"] = "::1"
    with pytest.raises(ValueError, match=r"^health_host='::1' needs a health_port"):
        trio_graceful.run(trio.sleep, 0, **options)


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (0, ValueError, "health_max_connections must be >= 1, not 0"),
        (-3, ValueError, "health_max_connections must be >= 1, not -3"),
        (True, TypeError, "health_max_connections must be an int, not True"),
        (2.0, TypeError, "health_max_connections must be an int, not 2.0"),
    ],
)
def test_a_bad_health_max_connections_is_refused_by_run(value, error, message):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        trio_graceful.run(trio.sleep, 0, health_port=0, health_max_connections=value)
