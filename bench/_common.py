"""What every benchmark script shares: repetitions, statistics, machine facts.

Measurements follow three rules, so that a busy machine distorts the
comparisons as little as possible:

* the variants being compared are *interleaved*: every repetition runs each
  of them once, in an order rotated from one repetition to the next, so that
  a burst of noise hits them alike;
* ratios are taken *within* a repetition (bundle time / nursery time of the
  same round) and summarised by their median;
* every figure is a median over several repetitions, with its spread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib.metadata
import math
import os
import platform
import re
import statistics
import time
import tracemalloc
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import trio

import trio_graceful

if TYPE_CHECKING:
    from typing_extensions import Self

T = TypeVar("T")

try:
    import anyio
except ImportError:  # the benchmarks run without it and say so
    anyio = None

# The variants every script compares, by the names the results use.
LABELS = {
    "trio": "trio.open_nursery",
    "bundle": "trio_graceful.open_bundle",
    "anyio": "anyio.create_task_group",
}

ANYIO_MISSING = (
    "anyio is not installed, so its task groups were not measured "
    "(install the 'bench' extra: pip install -e '.[bench]')"
)


def schedule(variants: Sequence[str], repetitions: int) -> Iterator[tuple[int, str]]:
    """``(repetition, variant)`` in the order to measure them.

    Repetition ``r`` starts with variant ``r % len(variants)``, so each
    variant runs first, second, ... equally often.
    """
    order = list(variants)
    for repetition in range(repetitions):
        start = repetition % len(order)
        for name in order[start:] + order[:start]:
            yield repetition, name


def interleave(
    variants: Sequence[str], repetitions: int, sample: Callable[[str], T]
) -> dict[str, list[T]]:
    """Call ``sample(variant)`` in the order of `schedule`; collect the results."""
    results: dict[str, list[T]] = {name: [] for name in variants}
    for _, name in schedule(variants, repetitions):
        results[name].append(sample(name))
    return results


def warm_up(variants: Sequence[str], sample: Callable[[str], object]) -> None:
    """Run each variant once, unmeasured: imports, caches and lazy set-up."""
    for name in variants:
        sample(name)


def percentile(samples: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile: a value that was actually measured."""
    ordered = sorted(samples)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def summarize(samples: Sequence[float]) -> dict[str, float | int]:
    """Median, 99th percentile and extremes of some samples."""
    return {
        "n": len(samples),
        "median": statistics.median(samples),
        "p99": percentile(samples, 0.99),
        "min": min(samples),
        "max": max(samples),
    }


def paired_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """Median of the ratios of samples taken in the same repetition."""
    return statistics.median(
        a / b for a, b in zip(numerators, denominators, strict=True)
    )


@contextlib.contextmanager
def collector(*, enabled: bool) -> Iterator[None]:
    """Start from a collected heap, with the garbage collector on or off.

    Left on (the default of every script), the collector's passes over the
    live tasks are part of what is measured, as they are part of what a
    program pays; ``--no-gc`` turns it off to show how much they weigh.
    """
    gc.collect()
    if not enabled:
        gc.disable()
    try:
        yield
    finally:
        gc.enable()


class Stopwatch:
    """Wall time and CPU time from `start` to `stop` (or of a ``with`` block).

    The CPU time is the process's (`time.process_time`): on a machine shared
    with other work it leaves out the time the process waited for a core,
    which wall time does not. The benchmarks that measure throughput report
    it first; on a quiet machine the two agree closely.

    `start` collects garbage first, and turns the collector off until `stop`
    if asked to.
    """

    def __init__(self, *, gc_enabled: bool) -> None:
        self._gc_enabled = gc_enabled
        self.started_at = math.nan
        self.elapsed = math.nan
        self.cpu = math.nan

    def start(self) -> None:
        gc.collect()
        if not self._gc_enabled:
            gc.disable()
        self._cpu_start = time.process_time()
        self.started_at = time.perf_counter()

    def stop(self) -> None:
        self.elapsed = time.perf_counter() - self.started_at
        self.cpu = time.process_time() - self._cpu_start
        gc.enable()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class TracedPeak:
    """The most memory Python allocated at once during a ``with`` block.

    Counted by `tracemalloc` (which must be tracing), above what was allocated
    when the block started: exact, repeatable, and blind to the allocator's
    own overhead and to memory the interpreter keeps for reuse.
    """

    def __init__(self) -> None:
        self.bytes = 0

    def __enter__(self) -> Self:
        gc.collect()
        tracemalloc.reset_peak()
        self._base = tracemalloc.get_traced_memory()[0]
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.bytes = tracemalloc.get_traced_memory()[1] - self._base


_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def rss_supported() -> bool:
    """True if the peak resident set size can be reset and read (Linux)."""
    return _STATUS.exists() and _CLEAR_REFS.exists()


def _status_kib(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB$", _STATUS.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {field} line")
    return int(match.group(1))


class RssPeak:
    """How far the resident set size rose during a ``with`` block, in KiB (Linux).

    Resets the kernel's high-water mark (``/proc/self/clear_refs``) on entry
    and reads it (``VmHWM``) on exit. This is what the machine paid, allocator
    included; run it in a fresh process, or memory freed by earlier work is
    reused and hides part of the cost.
    """

    def __init__(self) -> None:
        self.kib = 0

    def __enter__(self) -> Self:
        gc.collect()
        _CLEAR_REFS.write_text("5")
        self._base = _status_kib("VmRSS")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kib = _status_kib("VmHWM") - self._base


def growth(per_item: Mapping[int, float]) -> float:
    """Per-item cost at the largest size over the per-item cost at the smallest."""
    return per_item[max(per_item)] / per_item[min(per_item)]


# -- machine facts ------------------------------------------------------------


def _version_of(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_facts() -> tuple[str, int | None]:
    """The CPU model name and the number of physical cores, from /proc/cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), None
    model = platform.machine()
    cores: set[tuple[str, str]] = set()
    physical_id = ""
    for line in text.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "model name":
            model = value
        elif key == "physical id":
            physical_id = value
        elif key == "core id":
            cores.add((physical_id, value))
    return model, len(cores) or None


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, where the system has them."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def machine() -> dict[str, Any]:
    """Interpreter, library versions and hardware, for the results file."""
    model, cores = _cpu_facts()
    affinity = getattr(os, "sched_getaffinity", None)
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "trio": trio.__version__,
        "trio_graceful": trio_graceful.__version__,
        "anyio": _version_of("anyio"),
        "websockets": _version_of("websockets"),
        "trio_websocket": _version_of("trio-websocket"),
        "cpu": model,
        "physical_cores": cores,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(affinity(0)) if affinity is not None else None,
        "platform": platform.platform(),
    }


# -- what the reports are made of ---------------------------------------------


@dataclasses.dataclass(frozen=True)
class Table:
    """One table of a report; the cells are already formatted."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Goal:
    """One goal of the suite, what was measured against it, and the verdict."""

    item: str
    target: str
    measured: str
    met: bool


def _three_figures(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def fmt_seconds(seconds: float) -> str:
    """A duration in the unit that suits it: ``5.07 µs``, ``1.20 ms``, ``3.4 s``."""
    magnitude = abs(seconds)
    if magnitude < 1e-3:
        return f"{_three_figures(seconds * 1e6)} µs"
    if magnitude < 1:
        return f"{_three_figures(seconds * 1e3)} ms"
    return f"{_three_figures(seconds)} s"


def fmt_ratio(ratio: float) -> str:
    return f"{ratio:.2f}x"


def variants_note(variants: Mapping[str, str]) -> str:
    """``Variants: bundle = open_bundle(); trio = open_nursery().``"""
    return (
        "Variants: "
        + "; ".join(f"{name} = {label}" for name, label in variants.items())
        + "."
    )


def plural(count: int, noun: str) -> str:
    """``1 child``, ``100 children``, ``1,000 inboxes``."""
    if count == 1:
        return f"1 {noun}"
    return f"{count:,} {_PLURALS.get(noun, noun + 's')}"


_PLURALS = {"child": "children", "inbox": "inboxes", "leaf": "leaves"}
