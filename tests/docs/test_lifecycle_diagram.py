"""The documentation's state diagram is drawn from the transition table."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

from trio_graceful import LifecycleState
from trio_graceful._run._program._lifecycle import INITIAL_STATE, REACHABLE, TRANSITIONS

EXTENSION = (
    Path(__file__).parent.parent.parent / "docs" / "_ext" / "lifecycle_diagram.py"
)


def load_extension() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lifecycle_diagram", EXTENSION)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_state_and_every_transition_is_drawn():
    svg = load_extension().render_svg()
    boxes = re.findall(r'font-weight="bold">([^<]+)</text>', svg)
    assert sorted(boxes) == sorted(state.value for state in LifecycleState)
    arrows = re.findall(r'marker-end="url\(#arrow\)"/>\s*<text [^>]*>([^<]+)<', svg)
    assert sorted(arrows) == sorted(event.value for (_, event) in TRANSITIONS)


def test_states_are_ordered_from_the_initial_one():
    columns = load_extension().columns()
    assert columns[INITIAL_STATE] == 0
    for (source, _), target in TRANSITIONS.items():
        # Every arrow points right, except those that close a cycle.
        if columns[target] <= columns[source]:
            assert source in REACHABLE[target]


def test_the_text_version_lists_the_table():
    assert load_extension().render_text().splitlines() == [
        f"{s.value} --{e.value}--> {t.value}" for (s, e), t in TRANSITIONS.items()
    ]
