"""Load a script of ``examples/`` as a module (it is not a package) for a test, and find the
real Planetoid raw files (tests that need them skip where they are absent)."""

import importlib
import os
import sys
from pathlib import Path

import pytest

from hiergraph.datasets import planetoid as hp
from tests.conftest import SHARED_CORA

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def load_example(monkeypatch):
    """``load_example("name")`` imports ``examples/name.py``; it is unloaded after the test."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    loaded = []

    def load(name: str):
        loaded.append(name)
        return importlib.import_module(name)

    yield load
    for name in loaded:
        sys.modules.pop(name, None)


def planetoid_raw(name: str) -> Path | None:
    """A folder holding ``<name>/raw`` with PyG's raw files: ``$HIERGRAPH_RAW`` (a dataset
    collection) or the shared copy next to the repository; ``None`` where absent."""
    candidates = [SHARED_CORA.parents[1]]
    if os.environ.get(hp.RAW_ENV):
        candidates.insert(0, Path(os.environ[hp.RAW_ENV]))
    for folder in candidates:
        raw = folder / name / "raw"
        if all((raw / f).exists() for f in hp.planetoid_raw_files(name)):
            return folder
    return None


def needs_planetoid(name: str):
    return pytest.mark.skipif(planetoid_raw(name) is None, reason=f"real {name} raw files absent")
