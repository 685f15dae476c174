"""What the sdist and the wheel ship, built with the project's own backend."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

BUILD = """
import sys
from hatchling.build import build_sdist, build_wheel
print(build_sdist(sys.argv[1]))
print(build_wheel(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Build the sdist and the wheel once; return their paths."""
    directory = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-c", BUILD, str(directory)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    sdist, wheel = done.stdout.split()
    return directory / sdist, directory / wheel


def test_the_sdist_ships_the_license_and_the_sources(built: tuple[Path, Path]):
    sdist, _ = built
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
        top = sdist.name.removesuffix(".tar.gz")
        license_text = archive.extractfile(f"{top}/LICENSE")
        assert license_text is not None
        assert license_text.read() == (ROOT / "LICENSE").read_bytes()
    for expected in (
        "LICENSE",
        "README.md",
        "pyproject.toml",
        "trio_graceful/__init__.py",
        "trio_graceful/py.typed",
        "examples/tcp_echo_server.py",
    ):
        assert expected in names


def test_the_wheel_ships_the_license_and_declares_it(built: tuple[Path, Path]):
    _, wheel = built
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        dist_info = next(n.split("/")[0] for n in names if ".dist-info/" in n)
        assert archive.read(f"{dist_info}/licenses/LICENSE") == (
            (ROOT / "LICENSE").read_bytes()
        )
        metadata = archive.read(f"{dist_info}/METADATA").decode()
    assert "License-Expression: MIT\n" in metadata
    assert "License-File: LICENSE\n" in metadata
    # only the package itself is installed
    assert {n.split("/")[0] for n in names} == {"trio_graceful", dist_info}


def test_the_license_is_mit_by_the_authors_named_in_the_metadata():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith(
        "MIT License\n\nCopyright (c) 2026 The trio_graceful authors\n"
    )
    assert 'authors = [{ name = "The trio_graceful authors" }]' in (
        (ROOT / "pyproject.toml").read_text()
    )


def test_the_readme_names_every_runtime_dependency():
    # The dependencies as pyproject.toml declares them, read without tomllib
    # (Python 3.10 has none): the quoted names in the dependencies list.
    pyproject = (ROOT / "pyproject.toml").read_text()
    declared = pyproject.split("\ndependencies = [\n", 1)[1].split("\n]\n", 1)[0]
    names = [
        line.strip().strip('"').split()[0]
        for line in declared.splitlines()
        if line.strip().startswith('"')
    ]
    assert names == ["trio", "attrs", "h11", "exceptiongroup"]
    readme = (ROOT / "README.md").read_text()
    sentence = readme.split("the runtime dependencies are", 1)[1].split("\n\n", 1)[0]
    assert [name for name in names if f"`{name}`" not in sentence] == []
