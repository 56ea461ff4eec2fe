"""Load a script of ``examples/`` as a module (it is not a package) for a test."""

import importlib
import sys
from pathlib import Path

import pytest

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
