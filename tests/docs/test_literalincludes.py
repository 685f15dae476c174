"""Every ``literalinclude`` of the docs says what it includes.

Its caption names the file, as the repository spells its path, and the
function or class it shows (``examples/asgi_service.py: serve()``), so that a
reader of the .rst file and of the page alike knows where the code comes
from.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent.parent / "docs"
INCLUDE = re.compile(
    r"^\.\. literalinclude:: (\S+)\n((?:   :[\w-]+:.*\n)*)", flags=re.MULTILINE
)


def includes(text: str) -> list[tuple[str, dict[str, str]]]:
    """Each ``literalinclude`` of ``text``: its file and its options."""
    found = []
    for match in INCLUDE.finditer(text):
        options = dict(re.findall(r"   :([\w-]+):\s*(.*)\n", match.group(2)))
        found.append((match.group(1), options))
    return found


def problems(text: str) -> list[str]:
    """What is wrong with the captions of the includes of a page of docs/."""
    wrong = []
    for path, options in includes(text):
        caption = options.get("caption", "")
        shown = (DOCS / path).resolve().relative_to(DOCS.parent).as_posix()
        if not caption.startswith(shown):
            wrong.append(f"{path}: the caption {caption!r} does not name {shown}")
        name = options.get("pyobject")
        if name is not None and name not in caption:
            wrong.append(f"{path}: the caption {caption!r} does not name {name}")
    return wrong


PAGES = sorted(page.name for page in DOCS.glob("*.rst") if includes(page.read_text()))


@pytest.mark.parametrize("page", PAGES)
def test_every_literalinclude_has_a_caption_naming_what_it_shows(page: str):
    assert problems((DOCS / page).read_text()) == []


def test_the_pages_with_includes_are_found():
    assert {"asgi.rst", "tutorial.rst", "websocket_server.rst"} <= set(PAGES)


def test_a_missing_or_vague_caption_is_found():
    text = (
        ".. literalinclude:: ../examples/quickstart.py\n"
        "   :pyobject: main\n\n"
        ".. literalinclude:: ../examples/quickstart.py\n"
        "   :pyobject: worker\n"
        "   :caption: examples/quickstart.py: main()\n\n"
        ".. literalinclude:: deploy/Dockerfile\n"
        "   :caption: Dockerfile\n\n"
        ".. literalinclude:: deploy/Dockerfile\n"
        "   :caption: docs/deploy/Dockerfile, the whole file\n"
    )
    assert len(includes(text)) == 4
    assert problems(text) == [
        "../examples/quickstart.py: the caption '' does not name "
        "examples/quickstart.py",
        "../examples/quickstart.py: the caption '' does not name main",
        "../examples/quickstart.py: the caption 'examples/quickstart.py: main()' "
        "does not name worker",
        "deploy/Dockerfile: the caption 'Dockerfile' does not name "
        "docs/deploy/Dockerfile",
    ]
