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


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="needs setuptools")
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
