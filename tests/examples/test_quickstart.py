"""The quickstart example (also the README's example) does what it says."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.support.examples import load_example
from trio_graceful import ChildOutcome


async def test_quickstart_finishes_queued_jobs_and_bounds_the_stuck_task(
    autojump_clock, capsys
):
    quickstart = load_example("quickstart")
    t0 = trio.current_time()
    report = await quickstart.main()
    assert trio.current_time() - t0 == 2
    outcomes = {c.name: (c.outcome, c.elapsed) for c in report.children}
    assert outcomes == {
        "ann": (ChildOutcome.FINISHED, 0.1 + 0.2),  # two jobs, back to back
        "bob": (ChildOutcome.FINISHED, 0.1 + 0.2),
        "stuck": (ChildOutcome.CANCELLED, 2),
    }
    lines = capsys.readouterr().out.splitlines()
    for name in ("ann", "bob"):
        assert [line for line in lines if line.startswith(name)] == [
            f"{name}: finished a 0.1 s job",
            f"{name}: finished a 0.2 s job",
            f"{name}: got STOP, cleaning up",
        ]
    assert lines[-1] == (
        "bundle 'workers': 2 finished, 1 hard-cancelled, 0 raised, in 2.000 s"
    )


async def test_quickstart_with_a_short_grace_cuts_the_second_jobs(autojump_clock):
    quickstart = load_example("quickstart")
    report = await quickstart.main(grace=0.15)
    assert report.count(ChildOutcome.CANCELLED) == 3


def test_readme_example_is_the_quickstart():
    # The README shows the whole file after its docstring, so the example
    # users copy first is the one that runs here and is type-checked in CI.
    root = Path(__file__).resolve().parent.parent.parent
    readme = (root / "README.md").read_text()
    source = (root / "examples" / "quickstart.py").read_text()
    shown = readme.split("```python\n", 1)[1].split("```\n", 1)[0]
    assert shown == source[source.index("import trio\n") :]
