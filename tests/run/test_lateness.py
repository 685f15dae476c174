"""How the watchdog measures a late thread: wall time blocked, CPU time running.

Real threads: the point is what the kernel says of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from trio_graceful._run._exit._lateness import WALL_STEP, Lateness
from trio_graceful._run._exit._watchdog import (
    BUSY_ALLOWANCE,
    IDLE_ALLOWANCE,
    _Overdue,  # pyright: ignore[reportPrivateUsage]
    _TrioIdle,  # pyright: ignore[reportPrivateUsage]
)

pytestmark = pytest.mark.realtime


def watch(target: threading.Thread) -> Lateness:
    assert target.ident is not None
    assert target.native_id is not None
    return Lateness(target.ident, target.native_id)


def test_a_blocked_thread_uses_its_allowance_in_wall_time():
    release = threading.Event()
    blocked = threading.Thread(target=release.wait)
    blocked.start()
    try:
        lateness = watch(blocked)
        # Read before the first look and after the last: the looks' own
        # readings fall between, so the wall time they count is no more.
        started = time.monotonic()
        assert lateness.update() == 0  # the first look only starts the count
        for _ in range(10):
            time.sleep(0.02)
            used = lateness.update()
        assert 0.2 <= used <= time.monotonic() - started
    finally:
        release.set()
        blocked.join()


def test_a_long_gap_between_looks_counts_one_step():
    # The looker was the one kept waiting (for a CPU, on a loaded machine).
    release = threading.Event()
    blocked = threading.Thread(target=release.wait)
    blocked.start()
    try:
        lateness = watch(blocked)
        lateness.update()
        time.sleep(0.3)
        assert lateness.update() == WALL_STEP
    finally:
        release.set()
        blocked.join()


def test_a_thread_waiting_for_a_cpu_does_not_use_its_allowance():
    # The thread and a busy process share one CPU: the thread can run all
    # the time (state R) but runs about half of it; only that half counts.
    cpu = min(os.sched_getaffinity(0))
    hog = subprocess.Popen(
        [sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL
    )
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinning = threading.Thread(target=spin)
    spinning.start()
    try:
        assert spinning.native_id is not None
        os.sched_setaffinity(hog.pid, {cpu})
        os.sched_setaffinity(spinning.native_id, {cpu})
        lateness = watch(spinning)
        # Read around the looks, whose own readings fall between: the
        # interval they measured is no longer than this one.
        started = time.monotonic()
        lateness.update()
        time.sleep(1)
        used = lateness.update()
        elapsed = time.monotonic() - started
        assert 0 < used < 0.85 * elapsed, (used, elapsed)
    finally:
        stop.set()
        spinning.join()
        hog.kill()
        hog.wait()


def test_a_thread_that_has_ended_counts_wall_time():
    ended = threading.Thread(target=lambda: None)
    ended.start()
    lateness = watch(ended)
    ended.join()
    lateness.update()
    time.sleep(0.05)
    assert lateness.update() >= 0.05


def idle_thread() -> tuple[Lateness, _TrioIdle, threading.Event]:
    release = threading.Event()
    blocked = threading.Thread(target=release.wait, daemon=True)
    blocked.start()
    return watch(blocked), _TrioIdle(), release


def test_one_idle_wait_past_the_deadline_spends_the_allowance():
    lateness, trio_idle, release = idle_thread()
    overdue = _Overdue(lateness, trio_idle)
    trio_idle.before_io_wait(86_400)
    started = time.monotonic()
    while not overdue.spent():
        time.sleep(0.01)
    release.set()
    assert time.monotonic() - started >= IDLE_ALLOWANCE
    # The idle allowance ended it, not the busy one, however long a starved
    # machine made the looks: the count is the code's own, not a wall clock.
    assert lateness.used < BUSY_ALLOWANCE


def test_waits_that_end_between_looks_are_not_idleness():
    # As at the end of every run: a wait that a pending wake-up ends at once.
    # The thread is blocked all along, so only the busy allowance runs out.
    lateness, trio_idle, release = idle_thread()
    overdue = _Overdue(lateness, trio_idle)
    started = time.monotonic()
    while True:
        trio_idle.before_io_wait(86_400)
        if overdue.spent():
            break
        trio_idle.after_io_wait(0)
        time.sleep(0.01)
    release.set()
    assert time.monotonic() - started >= BUSY_ALLOWANCE


def test_a_wait_with_a_zero_timeout_is_not_idle():
    trio_idle = _TrioIdle()
    trio_idle.before_io_wait(0)
    assert trio_idle.wait == 0
    trio_idle.before_io_wait(0.5)
    assert trio_idle.wait == 1
    trio_idle.after_io_wait(0.5)
    assert trio_idle.wait == 0
