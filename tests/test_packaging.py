"""What an installed (not editable) copy of the package holds."""

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hiergraph.ops.hsa import native

ROOT = Path(__file__).resolve().parents[1]


def _builds_wheels() -> bool:
    """Whether setuptools here builds wheels without build isolation: 70.1 or newer, or an
    older one beside the ``wheel`` package (which held its ``bdist_wheel`` until then)."""
    if importlib.util.find_spec("setuptools") is None:
        return False
    from importlib.metadata import version

    release = tuple(int(part) for part in version("setuptools").split(".")[:2])
    return release >= (70, 1) or importlib.util.find_spec("wheel") is not None


@pytest.mark.skipif(not _builds_wheels(), reason="needs setuptools that builds wheels")
def test_the_wheel_holds_every_kernel_source(tmp_path):
    """The compiled kernel is built from its sources on first use, headers included: a
    wheel without them falls back to the slower PyTorch operations with a warning."""
    source = tmp_path / "source"  # a fresh copy: a build/ folder left in the checkout
    shutil.copytree(ROOT / "hiergraph", source / "hiergraph")  # would add stale files
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         str(source), "-w", str(tmp_path)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("hiergraph-*.whl")
    held = set(zipfile.ZipFile(wheel).namelist())
    folder = native.SOURCES[0].parent
    sources = sorted(folder.iterdir())
    assert {p.suffix for p in sources} == {".cpp", ".h"}
    for path in sources:
        assert path.relative_to(ROOT).as_posix() in held
