"""The package's layout: one-way layers, no import circles, modules by concept.

Every module of ``trio_graceful`` is read with `ast`, never imported, and
every ``import`` counts: at the top, under ``if TYPE_CHECKING:`` (a real
dependency of the code's meaning) and inside functions (a lazy import that
hides a circle is still a circle). A package's ``__init__`` running before its
modules is not counted as an import of the package.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import attrs

PACKAGE = "trio_graceful"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE
DESIGN = ROOT.parent / "docs" / "design.rst"

# What each private layer may import besides itself.
LAYERS: dict[str, frozenset[str]] = {
    "_core": frozenset(),
    "_children": frozenset({"_core"}),
    "_deploy": frozenset({"_core", "_children"}),
    "_run": frozenset({"_core", "_children", "_deploy"}),
    "_observe": frozenset({"_core"}),
}
# A smell detector, not a reason to split: a concept decides a module.
MAX_MODULE_LINES = 800


@attrs.frozen
class Module:
    name: str
    path: Path
    is_package: bool

    @property
    def package(self) -> str:
        """The package that relative imports start from."""
        return self.name if self.is_package else self.name.rpartition(".")[0]

    @property
    def layer(self) -> str:
        """The subpackage under ``trio_graceful`` (``""`` for the top)."""
        parts = self.name.split(".")
        return parts[1] if len(parts) > 1 and (ROOT / parts[1]).is_dir() else ""


def _modules() -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        name = ".".join(parts)
        modules[name] = Module(name, path, is_package)
    return modules


MODULES = _modules()


def _imported(module: Module, source: str) -> Iterator[tuple[str, int]]:
    """Yield (module, line) for every import in ``source``, the text of ``module``."""
    tree = ast.parse(source, str(module.path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.package.split(".")
                base = base[: len(base) - node.level + 1]
                if node.module:
                    base.append(node.module)
                source = ".".join(base)
            else:
                source = node.module or ""
            for alias in node.names:
                # ``from . import x`` imports the module x if there is one
                submodule = f"{source}.{alias.name}"
                yield (submodule if submodule in MODULES else source), node.lineno


def _imports(module: Module) -> dict[str, int]:
    """The modules of the package that ``module`` imports, with a line each."""
    found: dict[str, int] = {}
    for name, line in _imported(module, module.path.read_text()):
        if name in MODULES and name != module.name:
            found.setdefault(name, line)
    return found


GRAPH = {name: _imports(module) for name, module in MODULES.items()}


def _circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Return the strongly connected parts of ``graph`` that hold a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    parts: list[list[str]] = []

    def visit(name: str) -> None:  # Tarjan's algorithm
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for target in sorted(graph[name]):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in on_stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            part: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                part.append(member)
                if member == name:
                    break
            if len(part) > 1:
                parts.append(sorted(part))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return parts


def _one_circle(graph: dict[str, dict[str, int]], part: list[str]) -> list[str]:
    """Return one circle through the first module of ``part``, closed."""
    members = set(part)
    start = part[0]
    came_from: dict[str, str] = {}
    queue = [start]
    while queue:  # breadth first: the shortest way back to the start
        name = queue.pop(0)
        for target in sorted(graph[name]):
            if target == start:
                circle = [name]
                while circle[-1] != start:
                    circle.append(came_from[circle[-1]])
                return [*reversed(circle), start]
            if target in members and target not in came_from:
                came_from[target] = name
                queue.append(target)
    raise AssertionError(f"no circle through {start}")  # pragma: no cover


def _describe(graph: dict[str, dict[str, int]], circle: list[str]) -> str:
    steps = [
        f"{source} (line {graph[source][target]})"
        for source, target in itertools.pairwise(circle)
    ]
    return " -> ".join([*steps, circle[-1]])


def test_no_import_circle():
    circles = [_describe(GRAPH, _one_circle(GRAPH, part)) for part in _circles(GRAPH)]
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_a_circle_is_found_and_named():
    graph = {"a": {"b": 3}, "b": {"c": 5}, "c": {"a": 7, "d": 1}, "d": {}}
    parts = _circles(graph)
    assert parts == [["a", "b", "c"]]
    assert _describe(graph, _one_circle(graph, parts[0])) == (
        "a (line 3) -> b (line 5) -> c (line 7) -> a"
    )


def test_every_kind_of_import_is_read():
    source = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "from ._report import CancelReport\n"
        "from . import _stop\n"
        "from .. import jobs\n"
        "if TYPE_CHECKING:\n"
        "    from .._run._program._runner import Runner\n"
        "def f() -> None:\n"
        "    import trio_graceful._observe._plot\n"
    )
    module = MODULES[f"{PACKAGE}._core._bundle"]
    assert sorted(_imported(module, source), key=lambda found: found[1]) == [
        ("__future__", 1),
        ("typing", 2),
        (f"{PACKAGE}._core._report", 3),
        (f"{PACKAGE}._core._stop", 4),
        (f"{PACKAGE}.jobs", 5),
        (f"{PACKAGE}._run._program._runner", 7),
        (f"{PACKAGE}._observe._plot", 9),
    ]


def test_layers_import_one_way():
    wrong = [
        f"{name} imports {target} (line {line})"
        for name, targets in GRAPH.items()
        if MODULES[name].layer in LAYERS
        for target, line in targets.items()
        if MODULES[target].layer != MODULES[name].layer
        and MODULES[target].layer not in LAYERS[MODULES[name].layer]
    ]
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_no_module_is_over_the_line_budget():
    long = {
        name: lines
        for name, module in MODULES.items()
        if (lines := len(module.path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def _design_map() -> dict[str, set[str]]:
    """The modules in the first column of each layer's table in design.rst.

    A module in a subpackage of its layer is written with its room:
    ``_exit._guard``.
    """
    tables: dict[str, set[str]] = {}
    current: set[str] | None = None
    for line in DESIGN.read_text().splitlines():
        title = re.match(r"\.\. list-table:: ``(_\w+)``: ", line)
        if title is not None:
            current = tables.setdefault(title.group(1), set())
        elif line and not line.startswith(" "):  # the table has ended
            current = None
        elif current is not None and line.startswith("   * - "):
            current.update(re.findall(r"``(_[\w.]+)``", line))
    return tables


def test_the_design_maps_every_module_under_its_layer():
    on_disk = {
        layer: {
            name.split(".", 2)[2]  # within the layer: "_exit._guard"
            for name, module in MODULES.items()
            if module.layer == layer and not module.is_package
        }
        for layer in LAYERS
    }
    assert _design_map() == on_disk
