"""Every public function and class of the library documents each of its arguments, PyG's
way: a line ``name (type): ...`` (or ``a, b (type): ...``) in its docstring's ``Args:``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest

import hiergraph


def _public_objects() -> dict[str, object]:
    """The functions and classes named in the ``__all__`` of the library's packages, by
    qualified name (each once, named where it is defined)."""
    found = {}
    for module in pkgutil.walk_packages(hiergraph.__path__, "hiergraph."):
        if not module.ispkg or any(part.startswith("_") for part in module.name.split(".")):
            continue
        try:
            loaded = importlib.import_module(module.name)
        except ImportError:  # an optional dependency (transformers, triton, ...)
            continue
        for name in getattr(loaded, "__all__", ()):
            obj = getattr(loaded, name)
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__.startswith(
                "hiergraph."
            ):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


PUBLIC = _public_objects()


def _arguments(obj) -> list[str]:
    """The named arguments a user passes to ``obj`` (a class: to its constructor)."""
    if inspect.isclass(obj):
        if issubclass(obj, tuple) and hasattr(obj, "_fields"):
            return list(obj._fields)  # a NamedTuple: its fields, under ``Attributes:``
        function = obj.__init__
        if issubclass(obj, BaseException) or not function.__module__.startswith("hiergraph."):
            return []  # an error's message; a constructor documented where it is defined
    else:
        function = obj
    skipped = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    parameters = inspect.signature(function).parameters.values()
    return [p.name for p in parameters if p.name not in ("self", "cls") and p.kind not in skipped]


def test_the_public_api_is_found():
    assert len(PUBLIC) > 150
    assert "hiergraph.nn.position.FamilyPositionEncoder" in PUBLIC


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_argument_is_documented(name):
    obj = PUBLIC[name]
    doc = inspect.getdoc(obj) or ""
    missing = [
        arg
        for arg in _arguments(obj)
        if not re.search(rf"^\s*(\w+, )*{arg}(, \w+)*( \(|:)", doc, flags=re.MULTILINE)
    ]
    assert not missing, f"{name} documents no `name (type): ...` line for {missing}"
