"""Each page's install line installs what the examples it shows import.

A page shows an example when it includes it (``literalinclude``) or gives its
command line (``python examples/x.py``). Its install lines (``pip install
"trio-graceful[asgi-examples]"``, ``pip install -e ".[websocket]"``) name
extras of pyproject.toml, and perhaps other requirements; with the runtime
dependencies, they must bring every third-party module the example imports,
and the imports of the sibling examples it imports in turn. An example that
imports a subpackage with an extra of its name (``trio_graceful.asgi``,
``trio_graceful.mcp``) needs that extra, and the ``plot`` extra when it
draws a timeline.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import shlex
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # hatchling, in the test extra, brings tomli on Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent.parent
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "examples"
PROJECT = "trio-graceful"

SHOWN = re.compile(
    r"^\.\. literalinclude:: \.\./examples/(\w+)\.py$"
    r"|python3? examples/(\w+)\.py",
    flags=re.MULTILINE,
)
INSTALL = re.compile(r"pip install ([^`\n]+)")
EXTRAS = re.compile(r"^(?:trio[-_]graceful|\.)\[([\w,-]+)\]$")


def normalize(name: str) -> str:
    """A distribution's name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return normalize(re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0])


def installed_by(extras: set[str], others: set[str]) -> tuple[set[str], set[str]]:
    """The names of the distributions that an install of the project with
    ``extras``, and of ``others`` beside it, asks for (the runtime
    dependencies, each extra's requirements, and the extras that an extra
    names in turn, ``trio-graceful[asgi]``), and the extras installed."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional: dict[str, list[str]] = project["optional-dependencies"]
    names = {requirement_name(r) for r in project["dependencies"]} | others
    todo, seen = list(extras), set[str]()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        assert extra in optional, f"no extra {extra!r} in pyproject.toml"
        seen.add(extra)
        for requirement in optional[extra]:
            if requirement_name(requirement) == PROJECT:
                inner = re.search(r"\[([\w,-]+)\]", requirement)
                assert inner is not None, requirement
                todo.extend(inner.group(1).split(","))
            else:
                names.add(requirement_name(requirement))
    return names, seen


def install_lines(text: str) -> list[Line]:
    """The extras and the other requirements of each ``pip install`` in ``text``."""
    lines = []
    for match in INSTALL.finditer(text):
        extras: set[str] = set()
        others: set[str] = set()
        for word in shlex.split(match.group(1).split("&&")[0]):
            if word.startswith("-"):
                continue
            named = EXTRAS.match(word)
            if named is not None:
                extras |= {normalize(e) for e in named.group(1).split(",")}
            else:
                others.add(requirement_name(word))
        lines.append((extras, others))
    return lines


PLOTS = {"plot", "save_plot"}


def _top(module: str) -> str:
    """``trio_graceful.asgi`` for its modules, else the top-level package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "trio_graceful" else parts[0]


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"


def third_party_imports(example: str, seen: set[str] | None = None) -> set[str]:
    """The top-level modules that ``examples/<example>.py`` imports when it
    runs, outside the standard library and trio_graceful, with those of the
    examples it imports; imports only for type checkers do not count. The
    public subpackages of trio_graceful it imports are named whole
    (``trio_graceful.asgi``), and ``trio_graceful.plot`` stands for a call of
    a trace's ``plot`` or ``save_plot``."""
    seen = set() if seen is None else seen
    seen.add(example)
    found: set[str] = set()
    todo: list[ast.AST] = [ast.parse((EXAMPLES / f"{example}.py").read_text())]
    while todo:
        node = todo.pop()
        if _type_checking_only(node):
            continue
        if isinstance(node, ast.Import):
            found |= {_top(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            assert node.module is not None
            found.add(_top(node.module))
        elif isinstance(node, ast.Attribute) and node.attr in PLOTS:
            found.add("trio_graceful.plot")
        todo.extend(ast.iter_child_nodes(node))
    modules: set[str] = set()
    for name in found - set(sys.stdlib_module_names) - {"trio_graceful"}:
        if name.startswith("trio_graceful."):
            if not name.split(".")[1].startswith("_"):
                modules.add(name)
        elif (EXAMPLES / f"{name}.py").exists():
            if name not in seen:
                modules |= third_party_imports(name, seen)
        else:
            modules.add(name)
    return modules


@functools.cache
def _provided_by() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())


def distributions(module: str) -> set[str]:
    """The distributions that provide ``module``, as installed here; a module
    not installed is taken to come from the distribution of its name."""
    provided = _provided_by().get(module)
    return {normalize(d) for d in provided} if provided else {normalize(module)}


def covered(module: str, installed: set[str], extras: set[str]) -> bool:
    if module.startswith("trio_graceful."):
        # the extra of the subpackage's name, if pyproject.toml has one
        extra = module.split(".")[1]
        return extra in extras or extra not in _extras()
    return bool(distributions(module) & installed)


def _extras() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return set(project["optional-dependencies"])


Line = tuple[set[str], set[str]]
NOTHING: Line = (set(), set())


def missing(examples: list[str], line: Line) -> dict[str, list[str]]:
    """What each example imports that the install ``line`` does not bring."""
    installed, extras_installed = installed_by(*line)
    gaps = {}
    for example in examples:
        modules = sorted(
            m
            for m in third_party_imports(example)
            if not covered(m, installed, extras_installed)
        )
        if modules:
            gaps[example] = modules
    return gaps


PAGES = sorted(
    page.name for page in DOCS.glob("*.rst") if SHOWN.search(page.read_text())
)


@pytest.mark.parametrize("page", PAGES)
def test_the_page_install_line_installs_what_its_examples_import(page: str):
    text = (DOCS / page).read_text()
    examples = sorted({a or b for a, b in SHOWN.findall(text)})
    assert examples, page
    # One line of the page installs what all of them import; with no line,
    # the runtime dependencies must do.
    gaps = [missing(examples, line) for line in install_lines(text) or [NOTHING]]
    assert {} in gaps, gaps


def test_the_pages_show_the_examples_that_need_extras():
    # Every page that shows an example is checked, among them the ones that
    # need an extra.
    assert {"asgi.rst", "children.rst", "observability.rst"} <= set(PAGES)
    assert {"mcp.rst", "websocket_server.rst", "tutorial.rst"} <= set(PAGES)


def test_a_missing_extra_is_found():
    # starlette and quart come with asgi-examples, not with asgi alone
    [line] = install_lines('pip install "trio-graceful[asgi]"')
    assert line == ({"asgi"}, set())
    assert missing(["asgi_service", "quart_service"], line) == {
        "asgi_service": ["starlette"],
        "quart_service": ["quart", "quart_trio"],
    }
    # a requirement named beside the extras counts
    [line] = install_lines('pip install "trio-graceful[asgi]" starlette')
    assert missing(["asgi_service"], line) == {}
    # trio_graceful.asgi needs the asgi extra, which starlette does not bring
    [line] = install_lines("pip install starlette")
    assert missing(["asgi_service"], line) == {"asgi_service": ["trio_graceful.asgi"]}
    # a timeline needs the plot extra
    assert missing(["plot_nested_shutdown"], NOTHING) == {
        "plot_nested_shutdown": ["trio_graceful.plot"]
    }


def test_sibling_examples_and_type_checking_imports():
    # asgi_service imports websocket_requests, which imports
    # websocket_connection (and so websockets) only for type checkers.
    assert third_party_imports("asgi_service") == {
        "attrs",
        "starlette",
        "trio",
        "trio_graceful.asgi",
    }
    assert "websockets" in third_party_imports("websocket_close_server")


def test_the_readme_demo_command_installs_what_the_demo_imports():
    readme = (ROOT / "README.md").read_text()
    command = readme.split("<!-- demo-command -->", 1)[1].split("```", 2)[1]
    shown = re.findall(r"python examples/(\w+)\.py", command)
    assert shown == ["websocket_close_server"]
    [line] = install_lines(command)
    assert missing(shown, line) == {}
