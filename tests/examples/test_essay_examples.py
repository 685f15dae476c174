"""The essay's six examples, with their exact timelines on the mock clock."""

from __future__ import annotations

import random
import re
import subprocess
import sys

import pytest
import trio
import trio.testing

from tests.support.examples import EXAMPLES, load_example

ESSAY = sorted(p.stem for p in EXAMPLES.glob("essay_[0-9]_*.py"))


def events(timeline):
    # tasks that act in the same instant may log in either order
    return sorted(timeline.events)


async def test_trivial_worker_parent_returns_when_worker_ends(autojump_clock):
    example = load_example("essay_1_trivial_worker")
    assert events(await example.main(reply_after=65)) == [
        (60, "main", "cancel(grace=10)"),
        (65, "main", "cancel returned (worker finished)"),
        (65, "worker", "got 'Hello back', done"),
    ]


async def test_trivial_worker_done_before_cancel(autojump_clock):
    example = load_example("essay_1_trivial_worker")
    assert events(await example.main(reply_after=30)) == [
        (30, "worker", "got 'Hello back', done"),
        (60, "main", "cancel returned (no children were left)"),
        (60, "main", "cancel(grace=10)"),
    ]


async def test_trivial_worker_stuck_is_hard_cancelled(autojump_clock):
    example = load_example("essay_1_trivial_worker")
    assert events(await example.main(reply_after=None)) == [
        (60, "main", "cancel(grace=10)"),
        (70, "main", "cancel returned (worker cancelled)"),
    ]


async def test_infinite_loop_hard_cancelled_at_exactly_the_grace(autojump_clock):
    example = load_example("essay_2_infinite_loop")
    assert events(await example.main()) == [
        (60, "main", "cancel(grace=10)"),
        (70, "main", "cancel returned (worker cancelled)"),
        (70, "worker", "hard-cancelled"),
    ]


async def test_infinite_loop_grace_zero(autojump_clock):
    example = load_example("essay_2_infinite_loop")
    assert events(await example.main(grace=0)) == [
        (60, "main", "cancel returned (worker cancelled)"),
        (60, "main", "cancel(grace=0)"),
        (60, "worker", "hard-cancelled"),
    ]


async def test_shutdown_aware_worker_answers_in_flight_request(autojump_clock):
    example = load_example("essay_3_shutdown_aware")
    assert events(await example.main()) == [
        (59, "client", "sent request-1"),
        (59, "worker", "working on 'request-1'"),
        (60, "main", "shutdown(grace=10)"),
        (62, "client", "got 'reply to request-1'"),
        (62, "worker", "STOP at the idle point; flushing"),
        (64, "main", "shutdown returned (worker finished)"),
        (64, "worker", "flushed, done"),
    ]


async def test_shutdown_aware_worker_long_flush_bounded_by_grace(autojump_clock):
    example = load_example("essay_3_shutdown_aware")
    assert events(await example.main(flush=20)) == [
        (59, "client", "sent request-1"),
        (59, "worker", "working on 'request-1'"),
        (60, "main", "shutdown(grace=10)"),
        (62, "client", "got 'reply to request-1'"),
        (62, "worker", "STOP at the idle point; flushing"),
        (70, "main", "shutdown returned (worker cancelled)"),
    ]


async def test_peer_initiated_close(autojump_clock):
    example = load_example("essay_4_peer_close")
    assert events(await example.main(peer_closes_at=30)) == [
        (30, "peer", "got 'CLOSE'"),
        (30, "worker", "peer sent CLOSE; answering CLOSE"),
        (60, "main", "cancel returned (no children were left)"),
        (60, "main", "cancel(grace=10)"),
    ]


async def test_peer_initiated_close_during_grace(autojump_clock):
    example = load_example("essay_4_peer_close")
    assert events(await example.main(peer_closes_at=65)) == [
        (60, "main", "cancel(grace=10)"),
        (65, "main", "cancel returned (worker finished)"),
        (65, "peer", "got 'CLOSE'"),
        (65, "worker", "peer sent CLOSE; answering CLOSE"),
    ]


async def test_server_and_peer_initiated_close(autojump_clock):
    example = load_example("essay_5_both_closes")
    assert events(await example.main()) == [
        (30, "leaving", "closed by the peer"),
        (60, "main", "shutdown(grace=10)"),
        (60, "polite", "STOP: sending CLOSE, waiting for the peer's CLOSE"),
        (60, "silent", "STOP: sending CLOSE, waiting for the peer's CLOSE"),
        (61, "polite", "closed by the server"),
        (70, "main", "shutdown returned (polite finished, silent cancelled)"),
    ]


async def test_nested_outer_deadline_wins(autojump_clock):
    example = load_example("essay_6_nested")
    assert events(await example.main()) == [
        (60, "main", "shutdown(grace=10)"),
        (60, "worker", "STOP: shutting nested workers down, grace 20 s"),
        (70, "main", "shutdown returned (worker cancelled)"),
        (70, "nested", "hard-cancelled on 'request-0'"),
        (70, "nested", "hard-cancelled on 'request-1'"),
        (70, "worker", "the outer deadline cut the nested grace short"),
    ]


async def test_nested_finishing_early_returns_early(autojump_clock):
    example = load_example("essay_6_nested")
    assert events(await example.main(nested_work=3)) == [
        (60, "main", "shutdown(grace=10)"),
        (60, "worker", "STOP: shutting nested workers down, grace 20 s"),
        (63, "main", "shutdown returned (worker finished)"),
        (63, "nested", "finished 'request-0'"),
        (63, "nested", "finished 'request-1'"),
        (63, "worker", "nested bundle done (request-0 finished, request-1 finished)"),
    ]


@pytest.mark.parametrize("name", ESSAY)
def test_examples_run_as_scripts(name):
    """Each example runs from the command line and prints its timeline."""
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert " s  main " in result.stdout
    assert result.stderr == ""


def test_the_essay_shows_six_examples():
    assert len(ESSAY) == 6


# -- the printed order -----------------------------------------------------------------


def printed(name: str) -> list[str]:
    example = load_example(name)
    timeline = trio.run(
        example.main, clock=trio.testing.MockClock(autojump_threshold=0)
    )
    return timeline.lines()


@pytest.mark.parametrize("name", ESSAY)
def test_a_timeline_prints_in_the_same_order_whatever_the_scheduler_did(name):
    # Trio runs the tasks that are ready together in a random order, so the
    # events of one instant are recorded in varying orders from run to run.
    first = printed(name)
    for _ in range(20):
        assert printed(name) == first


def test_events_of_one_instant_print_by_pass_then_who_and_what():
    async def main() -> list[list[str]]:
        support = load_example("essay_support")
        recorded = [
            (0.0, 1, "worker", "b"),
            (60.0, 7, "main", "shutdown"),
            (60.0, 9, "worker", "STOP"),  # woken by main: a later pass
            (60.0, 9, "client", "sent"),
            (60.0, 9, "client", "got"),
            (70.0, 12, "main", "returned"),
        ]
        outputs = []
        rng = random.Random(0)
        for _ in range(50):
            order = rng.sample(recorded, len(recorded))
            timeline = support.Timeline()
            timeline.events = [(at, who, what) for at, _, who, what in order]
            timeline.passes = [step for _, step, _, _ in order]
            outputs.append(timeline.lines())
        return outputs

    outputs = trio.run(main)
    assert outputs[0] == [
        "   0.00 s  worker   b",
        "  60.00 s  main     shutdown",
        "  60.00 s  client   got",
        "  60.00 s  client   sent",
        "  60.00 s  worker   STOP",
        "  70.00 s  main     returned",
    ]
    assert all(output == outputs[0] for output in outputs)


def test_the_tutorials_timelines_are_what_the_examples_print():
    tutorial = (EXAMPLES.parent / "docs" / "tutorial.rst").read_text()
    blocks = [
        [line[4:] for line in block.splitlines() if line.strip()]
        for block in re.findall(r"::\n\n((?:      +\d+\.\d\d s  .*\n)+)", tutorial)
    ]
    outputs = [printed(name) for name in ESSAY]
    assert len(blocks) == 4
    for block in blocks:
        assert block in outputs
