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

from trio_graceful._lateness import Lateness

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
        assert lateness.update() == 0  # the first look only starts the count
        started = time.monotonic()
        time.sleep(0.2)
        used = lateness.update()
        assert 0.2 <= used <= time.monotonic() - started
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
        lateness.update()
        started = time.monotonic()
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
