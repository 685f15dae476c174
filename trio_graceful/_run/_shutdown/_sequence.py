"""The sequence of a shutdown: withdrawal, the drain under one deadline, the force.

A shutdown, whatever starts it (a signal, `Runner.request_shutdown`,
``main`` returning or failing), goes through the stages of ``_stages`` in
order, and `Shutdown` is what moves it along:

1. ``begin``: with a drain delay, a program that is ready is first withdrawn
   from rotation (`Stage.WITHDRAWN`) and serves on until the delay ends; the
   watchdog allows the whole of the stop time from then on;
2. the shutdown proper: one deadline, ``grace`` seconds on, for the root
   bundle and then the services (which the program drains); nothing new may
   start, the collector's full collections are put off;
3. ``force``, at the end of the grace or at a second signal: what is
   draining now is hard-cancelled, the collector is paused, and the unwind
   budget starts.

The deadline is enforced by the bundles alone; `Shutdown` only notices that
it passed (to log it, pause the collector and start the unwind budget). What
it needs of the program (is ``main`` ready? stop anything new; which bundle
drains) it gets through a `ShutdownHooks` record.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import final

import attrs
import trio

from ..._core._bundle import Bundle
from ..._core._log import library_logger
from ..._core._lowlevel import signal_name
from .._exit._watchdog import Watchdog
from ._gcdeferral import GcHold
from ._stages import Move, Stage, Stages
from ._stoptime import StopTimes

logger = library_logger("trio_graceful.runner")


def format_grace(grace: float) -> str:
    """The grace for the log: ``grace 5 s``, or ``no time limit``."""
    return "no time limit" if grace == math.inf else f"grace {grace:g} s"


@attrs.frozen(kw_only=True)
class ShutdownHooks:
    """What a `Shutdown` asks of its program."""

    ready: Callable[[], bool]
    """Whether ``main`` is ready (only a ready program is withdrawn first)."""

    stop_starting: Callable[[], object]
    """The shutdown proper began: refuse new services, cancel ``main``'s startup."""

    draining: Callable[[Stage], Bundle | None]
    """The bundle that a forced ``Stage`` hard-cancels, if it exists yet."""


@final
class Shutdown:
    """The shutdown of one run (see the module docstring).

    Args:
        times: The drain delay, grace and unwind budget in force.
        stages: The run's stages, which this object moves until the drain.
        watchdog: Armed at each step.
        gc: The run's hold on the collector.
        hooks: What the program does at each step.
    """

    def __init__(
        self,
        *,
        times: StopTimes,
        stages: Stages,
        watchdog: Watchdog,
        gc: GcHold,
        hooks: ShutdownHooks,
    ) -> None:
        self._times = times
        self._stages = stages
        self._watchdog = watchdog
        self._gc = gc
        self._hooks = hooks
        self._control: trio.Nursery | None = None
        self._delay_scope = trio.CancelScope()
        self._delay_ends = math.inf
        self._deadline = math.inf

    @property
    def deadline(self) -> float:
        """The end of the grace, in Trio time; `math.inf` before the shutdown."""
        return self._deadline

    def drain_delay_left(self, now: float) -> float | None:
        """Seconds left of the drain delay at ``now`` while withdrawn, else None."""
        if not self._stages.withdrawn:
            return None
        return max(0.0, self._delay_ends - now)

    def grace_left(self, now: float) -> float | None:
        """Seconds left at ``now`` of a finite grace under way, else None."""
        if not self._stages.shutting_down or self._deadline == math.inf:
            return None
        return max(0.0, self._deadline - now)

    def attach(self, control: trio.Nursery) -> None:
        """Run the shutdown's timers and hard cancels in ``control``.

        Call it once, before anything can begin the shutdown.
        """
        self._control = control

    def begin(
        self,
        reason: str,
        *,
        signum: int | None = None,
        delay: bool = False,
        quiet: bool = False,
    ) -> bool:
        """Start the shutdown; False if it had already begun. Not a checkpoint.

        With ``delay`` (a signal, `Runner.request_shutdown`), a program that
        takes work is first withdrawn from rotation for the drain delay.
        Without (main ended, a failure), a withdrawn program shuts down now.
        With ``quiet`` (a failed startup, already logged), the shutdown's
        line is logged at DEBUG.
        """
        stages = self._stages
        if stages.shutting_down or (delay and stages.withdrawn):
            return False
        if delay and self._times.drain_delay > 0 and self._hooks.ready():
            self._withdraw(reason, signum)
        else:
            self._shut_down(reason, signum, quiet=quiet)
        return True

    def _withdraw(self, reason: str, signum: int | None) -> None:
        delay = self._times.drain_delay
        self._delay_ends = trio.current_time() + delay
        self._stages.move(Move.WITHDRAW, reason)
        self._watchdog.withdrawal_began()
        logger.log(
            logging.WARNING if signum is not None else logging.INFO,
            "%s: not ready; serving %g s more (drain delay), then shutting down (%s)",
            signal_name(signum) if signum is not None else reason,
            delay,
            format_grace(self._times.grace),
        )
        self._start_soon(self._end_drain_delay, reason, name="<drain delay>")

    async def _end_drain_delay(self, reason: str) -> None:
        with self._delay_scope:
            await trio.sleep_until(self._delay_ends)
        if self._stages.withdrawn:
            self._shut_down(f"{reason}, after the drain delay", None)

    def _shut_down(
        self, reason: str, signum: int | None, *, quiet: bool = False
    ) -> None:
        grace = self._times.grace
        self._delay_scope.cancel()
        self._deadline = trio.current_time() + grace
        self._stages.move(Move.SHUT_DOWN, reason)
        self._hooks.stop_starting()
        self._watchdog.shutdown_began()
        # What the program built before its shutdown is long-lived; full
        # collections during the drain would walk all of it again and again
        # (1,000 WebSocket connections of the example server were all closed
        # in 0.2 s instead of 0.3 without them).
        self._gc.hold_full_collections()
        if signum is not None:
            logger.warning(
                "%s: shutting down (%s)", signal_name(signum), format_grace(grace)
            )
        else:
            logger.log(
                logging.DEBUG if quiet else logging.INFO,
                "shutting down (%s): %s",
                format_grace(grace),
                reason,
            )
        if self._deadline != math.inf:
            self._start_soon(self._notice_end_of_grace, name="<end of grace>")

    async def _notice_end_of_grace(self) -> None:
        # The bundles' own deadlines hard-cancel; this only notices.
        await trio.sleep_until(self._deadline)
        self.force(f"the {format_grace(self._times.grace)} ran out", cancel=False)

    def force(self, reason: str, *, cancel: bool = True) -> None:
        """Hard-cancel what is draining now; the unwind budget starts.

        Does nothing once forced or ended. Not a checkpoint.
        """
        stages = self._stages
        if stages.forced or stages.stage is Stage.ENDED:
            return
        if stages.withdrawn:  # a second signal during the drain delay
            self._shut_down(f"{reason}, during the drain delay", None)
        stage = stages.move(Move.FORCE)
        self._deadline = min(self._deadline, trio.current_time())
        # The program is ending: collecting garbage while thousands of tasks
        # unwind only delays that (1,000 WebSocket connections unwound in
        # 0.35 s instead of 0.8 s).
        self._gc.hold_pause()
        logger.warning("forcing: %s", reason)
        self._watchdog.hard_cancel_began()
        # The services outlive main even now (main's unwinding may use them):
        # their deadline is set, now passed, once the root bundle has closed.
        bundle = self._hooks.draining(stage)
        if cancel and bundle is not None and not bundle.closed:
            self._start_soon(bundle.cancel, 0, name=f"<hard cancel of {bundle.name!r}>")

    def _start_soon(
        self, fn: Callable[..., Awaitable[object]], *args: object, name: str
    ) -> None:
        assert self._control is not None
        self._control.start_soon(fn, *args, name=name)
