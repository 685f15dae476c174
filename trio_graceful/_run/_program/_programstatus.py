"""What a program run by `trio_graceful.run` tells the outside world: `ProgramStatus`.

One snapshot answers every observer: the health endpoint's ``/readyz`` and
``/statusz``, the service manager's ``STATUS=`` lines, and `Runner.status`.
It is computed by ``Program.status`` from the state's one owners (the
lifecycle, the runner's stage, the shutdown's deadlines, the bundles) each
time it is asked for, never kept beside them.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from ..._core._log import plural
from ._lifecycle import LifecycleState


@attrs.frozen(kw_only=True)
class ProgramStatus:
    """A snapshot of a program's state, returned by `Runner.status`."""

    name: str
    """The program's name."""

    state: LifecycleState
    """Its `LifecycleState`."""

    reason: str
    """Why that state was entered (`Lifecycle.reason`)."""

    ready: bool
    """Whether it takes new work (`Lifecycle.ready`), which ``/readyz`` says."""

    live: bool
    """Whether it runs at all (True until the run has ended)."""

    drain_delay_left: float | None
    """Seconds left of the drain delay while withdrawn, else None."""

    grace_left: float | None
    """Seconds left of the grace while shutting down under a finite grace, else None."""

    forced: bool
    """Whether the shutdown has been forced (a hard cancel)."""

    tasks_running: int
    """Tasks of the root bundle (``main`` and the tasks started there) still running."""

    services_running: tuple[str, ...]
    """The names of the services still running, in start order."""

    details: Mapping[str, object] = attrs.field(factory=dict[str, object])
    """What the program's parts add (`Runner.status_detail`), JSON-able, by
    name; ``/statusz`` shows each under its name, beside the fields above."""

    def describe(self) -> str:
        """One line for a person: the state and, while leaving, the drain's progress."""
        if self.drain_delay_left is not None:
            return (
                f"{self.state.value}: serving {self.drain_delay_left:.1f} s more, "
                f"{plural(self.tasks_running, 'task')} running"
            )
        if self.state is LifecycleState.SHUTTING_DOWN:
            left = (
                "no time limit"
                if self.grace_left is None
                else f"{self.grace_left:.1f} s of grace left"
            )
            if self.forced:
                left = "forced"
            return (
                f"{self.state.value}: waiting for "
                f"{plural(self.tasks_running, 'task')} and "
                f"{plural(len(self.services_running), 'service')}, {left}"
            )
        return f"{self.state.value}" + (f" ({self.reason})" if self.reason else "")

    def as_dict(self) -> dict[str, object]:
        """The snapshot as JSON-able values, the state as its string value.

        Each of `details` is a key of its own.
        """
        result = attrs.asdict(self, recurse=False)
        result["state"] = self.state.value
        result["services_running"] = list(self.services_running)
        del result["details"]
        return result | dict(self.details)
