"""Putting off the garbage collector during shutdowns, process-wide and counted.

The collector's settings belong to the process, not to one Trio run, so two
runs that overlap (each in its own thread, with ``signals=()``) share them.
This module owns them: each run takes a *hold* on the deferral it needs and
gives it back when it ends, and the settings are changed by the first hold and
restored by the last one. A run that saved "the originals" while another run
had already changed them would restore the other run's changes for good.

Two levels of deferral, each counted on its own:

* *full collections put off* (`hold_full_collections`): the third threshold
  of `gc.set_threshold` is raised so that full collections do not come, while
  young garbage is still collected;
* *collector paused* (`hold_pause`): `gc.disable`, for a forced shutdown.

A program that had turned automatic collection off (first threshold 0, or
`gc.disable`) keeps it off: nothing is changed, nothing restored.
"""

from __future__ import annotations

import gc
import threading
from typing import Final, final

import attrs

# Full collections come after this many collections of the middle
# generation: that is, not at all during a shutdown.
NO_FULL_COLLECTIONS: Final = 1_000_000


@attrs.define(eq=False)
class _Deferrals:
    lock: threading.Lock = attrs.field(factory=threading.Lock)
    full_holds: int = 0
    # The thresholds before the first hold; None if it changed nothing.
    saved_thresholds: tuple[int, int, int] | None = None
    pause_holds: int = 0
    # Whether the first pause hold disabled the collector.
    disabled_it: bool = False


_deferrals: Final = _Deferrals()


@final
@attrs.define(eq=False)
class GcHold:
    """One run's holds on the collector's deferral; release them with `release`."""

    _full: bool = False
    _pause: bool = False

    def hold_full_collections(self) -> None:
        """Put off full collections until the last holder releases. Idempotent."""
        if self._full:
            return
        self._full = True
        with _deferrals.lock:
            _deferrals.full_holds += 1
            if _deferrals.full_holds > 1:
                return
            thresholds = gc.get_threshold()
            if thresholds[0] > 0:  # 0: the program turned collection off
                _deferrals.saved_thresholds = thresholds
                gc.set_threshold(thresholds[0], thresholds[1], NO_FULL_COLLECTIONS)

    def hold_pause(self) -> None:
        """Pause the collector until the last holder releases. Idempotent."""
        if self._pause:
            return
        self._pause = True
        with _deferrals.lock:
            _deferrals.pause_holds += 1
            if _deferrals.pause_holds == 1 and gc.isenabled():
                gc.disable()
                _deferrals.disabled_it = True

    def release(self) -> None:
        """Give back this run's holds; the last holder restores the settings."""
        full, pause = self._full, self._pause
        self._full = self._pause = False
        with _deferrals.lock:
            if pause:
                _deferrals.pause_holds -= 1
                if _deferrals.pause_holds == 0 and _deferrals.disabled_it:
                    _deferrals.disabled_it = False
                    gc.enable()
            if full:
                _deferrals.full_holds -= 1
                saved = _deferrals.saved_thresholds
                if _deferrals.full_holds == 0 and saved is not None:
                    _deferrals.saved_thresholds = None
                    gc.set_threshold(*saved)
