"""The library's log lines reach a strict UTF-8 handler, lone surrogates escaped.

A lone surrogate comes from text the library did not write: a message of a
job's exception, a ``SystemExit`` message, a path decoded with
``surrogateescape``. Each test writes through a handler whose stream refuses
what UTF-8 cannot encode, as a log file or a pipe does, and checks that the
line was written, escaped, and that ``logging`` printed no error.
"""

from __future__ import annotations

import importlib
import io
import logging
import pkgutil
import re
import types
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import trio
import trio.testing

import trio_graceful
from trio_graceful._core._log import escape_surrogates, library_logger, plural
from trio_graceful.jobs._records import JobRecord
from trio_graceful.jobs._traceback import report_failure

BAD = "caf\udce9"  # b"caf\xe9" decoded as UTF-8 with surrogateescape
ESCAPED = "caf\\udce9"


@pytest.fixture
def strict() -> Iterator[io.TextIOWrapper]:
    """A strict UTF-8 stream that receives every line of the library's loggers."""
    stream = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    root = logging.getLogger("trio_graceful")
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _written(stream: io.TextIOWrapper) -> str:
    stream.flush()
    return cast("io.BytesIO", stream.buffer).getvalue().decode("utf-8")


def test_escape_surrogates_escapes_only_lone_surrogates() -> None:
    assert escape_surrogates(BAD) == ESCAPED
    text = "caf\u00e9 \U0001f600"
    assert escape_surrogates(text) is text  # nothing to escape: the same str


def _library_loggers() -> Iterator[tuple[str, logging.Logger]]:
    for info in pkgutil.walk_packages(trio_graceful.__path__, "trio_graceful."):
        if info.name.startswith("trio_graceful.jobs._postgres"):
            continue  # needs psycopg; its logger, if any, is checked below
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, logging.Logger) and value.name.startswith(
                "trio_graceful"
            ):
                yield info.name, value


def test_every_logger_of_the_library_escapes_its_records() -> None:
    found = dict(_library_loggers())
    assert "trio_graceful.asgi._connection" in found
    for module, logger in found.items():
        assert logger.filters, f"{module}: {logger.name} has no escaping filter"
        assert logger.filters == library_logger(logger.name).filters


def test_a_lone_surrogate_in_the_message_argument_or_traceback_is_escaped(
    strict: io.TextIOWrapper, capsys: pytest.CaptureFixture[str]
) -> None:
    logger = library_logger("trio_graceful.tests")
    logger.warning(f"text {BAD}")
    logger.warning("argument %s", BAD)
    try:
        raise ValueError(BAD)
    except ValueError:
        logger.exception("traceback")
    lines = _written(strict)
    assert f"WARNING text {ESCAPED}\n" in lines
    assert f"WARNING argument {ESCAPED}\n" in lines
    assert f"ValueError: {ESCAPED}\n" in lines
    assert "Logging error" not in capsys.readouterr().err


def test_a_jobs_failure_with_a_lone_surrogate_is_logged(
    strict: io.TextIOWrapper, capsys: pytest.CaptureFixture[str]
) -> None:
    job = cast("JobRecord", types.SimpleNamespace(id="j1", kind=f"resize {BAD}"))
    try:
        raise OSError(f"cannot open {BAD}")
    except OSError as exc:
        report_failure("w1", job, "raised", exc)
    lines = _written(strict)
    assert f"WARNING worker w1: job j1 (resize {ESCAPED}) failed: raised\n" in lines
    assert f"OSError: cannot open {ESCAPED}\n" in lines
    assert "Logging error" not in capsys.readouterr().err


def test_the_runner_logs_a_failure_and_a_system_exit_with_lone_surrogates(
    strict: io.TextIOWrapper, capsys: pytest.CaptureFixture[str]
) -> None:
    async def fails() -> None:
        raise RuntimeError(f"no config at /etc/{BAD}")

    async def exits() -> None:
        raise SystemExit(f"bad argument {BAD}")

    clock = trio.testing.MockClock(autojump_threshold=0)
    assert trio_graceful.run(fails, clock=clock) == 1
    assert trio_graceful.run(exits, clock=clock) == 1
    lines = _written(strict)
    assert f"RuntimeError: no config at /etc/{ESCAPED}\n" in lines
    assert f"ERROR bad argument {ESCAPED}\n" in lines
    assert "Logging error" not in capsys.readouterr().err


# -- counts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "noun", "plural_form", "text"),
    [
        (0, "connection", None, "0 connections"),
        (1, "connection", None, "1 connection"),
        (2, "connection", None, "2 connections"),
        (1, "child", "children", "1 child"),
        (3, "child", "children", "3 children"),
        (-1, "job", None, "-1 jobs"),
    ],
)
def test_plural_says_a_count_with_its_noun(
    count: int, noun: str, plural_form: str | None, text: str
) -> None:
    assert plural(count, noun, plural_form) == text


def test_no_message_of_the_library_puts_a_plural_noun_after_a_bare_count() -> None:
    # "%d connections" reads "1 connections"; plural() says it right.
    root = Path(trio_graceful.__file__).parent
    bare = re.compile(r"(%d|\{[^{}]*\}) (?!(is|was|has|needs)\b)[a-z]+s\b")
    constant = "{MAX_DEPTH} levels"  # a constant, never 1
    found = [
        f"{path.relative_to(root)}:{number}: {line.strip()}"
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if bare.search(line) and ('"' in line or "'" in line) and constant not in line
    ]
    assert found == []


async def test_a_bundles_progress_and_a_programs_status_count_in_the_singular() -> None:
    status = trio_graceful.ProgramStatus(
        name="main",
        state=trio_graceful.LifecycleState.SHUTTING_DOWN,
        reason="SIGTERM",
        ready=False,
        live=True,
        drain_delay_left=None,
        grace_left=2.0,
        forced=False,
        tasks_running=1,
        services_running=("db",),
    )
    assert status.describe() == (
        "shutting down: waiting for 1 task and 1 service, 2.0 s of grace left"
    )
