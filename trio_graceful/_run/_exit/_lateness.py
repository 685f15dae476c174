"""How late a thread is, counting only the time it had a chance to finish.

The watchdog gives a Trio thread that is still busy when its deadline passes
a little more time (`_stoptime.BUSY_ALLOWANCE`). On a loaded machine, wall
time is a poor measure of that: a thread that waits for a CPU a whole second
has not been given a second. `Lateness` counts

* the thread's own CPU time while it can run (state ``R`` in
  ``/proc/self/task/<tid>/stat``) or waits for the disk (``D``): a thread in
  a loop uses its allowance, a thread waiting for a CPU, or reading a module
  from a disk that other processes keep busy, does not;
* wall time while it cannot run and did not run (blocked in a call that
  does not return): that is the stuck thread the allowance is for. At most
  `WALL_STEP` is counted between two calls: a longer gap means the caller
  itself waited for a CPU, which says nothing of the thread.

Where the thread's CPU clock or its ``/proc`` entry is not available (not
Linux), every second of wall time counts, as before.
"""

from __future__ import annotations

import time
from typing import Final, final

# CPU seconds in an interval that show the thread ran in it.
_RAN: Final = 0.0005

WALL_STEP: Final = 0.1
"""The most wall time counted between two calls of `Lateness.update`."""


def _cpu_clock(ident: int) -> int | None:
    try:
        return time.pthread_getcpuclockid(ident)
    except (AttributeError, OSError):  # not on this platform, or thread gone
        return None


@final
class Lateness:
    """The allowance a thread has used since its deadline passed.

    Args:
        ident: The thread's `threading.get_ident` value.
        native_id: Its `threading.get_native_id` value.
    """

    def __init__(self, ident: int, native_id: int) -> None:
        self._clock = _cpu_clock(ident)
        self._stat = f"/proc/self/task/{native_id}/stat"
        self._last: tuple[float, float | None] | None = None  # (wall, cpu)
        self.used = 0.0
        """Seconds of the allowance used, as of the last `update`."""

    def update(self) -> float:
        """Count the time since the previous call; return `used`."""
        wall, cpu = time.monotonic(), self._cpu_time()
        if self._last is not None:
            last_wall, last_cpu = self._last
            ran = None if cpu is None or last_cpu is None else cpu - last_cpu
            # A thread that ran at all in the interval, or can run now, is
            # charged its CPU time. The state alone would mislead: a running
            # Python thread waits (state S) for the GIL whenever the thread
            # that reads its state holds it.
            if ran is not None and (ran > _RAN or self._can_run()):
                self.used += max(0.0, ran)
            else:
                self.used += min(wall - last_wall, WALL_STEP)
        self._last = (wall, cpu)
        return self.used

    def _cpu_time(self) -> float | None:
        if self._clock is None:
            return None
        try:
            return time.clock_gettime(self._clock)
        except OSError:  # the thread has ended
            return None

    def _can_run(self) -> bool:
        """Whether the thread runs, waits for a CPU, or waits for the disk."""
        try:
            with open(self._stat, "rb") as stat:
                fields = stat.read()
        except OSError:
            return False
        # The state follows the command name, which may hold spaces and ")".
        state = fields[fields.rindex(b")") + 2 :][:1]
        return state in (b"R", b"D")
