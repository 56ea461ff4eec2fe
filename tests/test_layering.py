"""Dependencies go one way: plan → data → ops → nn → integrations (no import of a higher
layer from a lower one, not even inside a function)."""

import ast
from pathlib import Path

import pytest

import hiergraph

PACKAGE = Path(hiergraph.__file__).parent
#: layer -> the packages it must never import
FORBIDDEN = {
    "plan": ("data", "ops", "masks", "nn", "integrations", "datasets", "transforms", "loader"),
    "data": ("ops", "masks", "nn", "integrations", "datasets", "transforms", "loader"),
    "ops": ("masks", "nn", "integrations", "datasets", "transforms", "loader"),
    "masks": ("nn", "integrations", "datasets", "transforms", "loader"),
    "nn": ("integrations", "datasets"),
}


def imported_modules(path: Path, source: str | None = None) -> set[str]:
    """Every module an ``import``/``from ... import`` anywhere in ``path`` (or in ``source``
    read as that file) names, relative imports resolved against ``path``'s package
    (``from ..nn import x`` in ``hiergraph/ops/a.py`` is ``hiergraph.nn``)."""
    package = ["hiergraph", *path.relative_to(PACKAGE).parent.parts]
    names = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            names.add(".".join([*base, *([node.module] if node.module else [])]))
    return names


def test_relative_imports_are_resolved():
    """(They were skipped, so ``from ..nn import x`` inside ``ops`` passed.)"""
    source = "from ..nn import a\nfrom . import b\nfrom .hsa import c\nimport torch\n"
    found = imported_modules(PACKAGE / "ops" / "example.py", source)
    assert found == {"hiergraph.nn", "hiergraph.ops", "hiergraph.ops.hsa", "torch"}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_lower_layers_never_import_higher_ones(layer):
    bad = []
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        for module in imported_modules(path):
            parts = module.split(".")
            if parts[0] == "hiergraph" and len(parts) > 1 and parts[1] in FORBIDDEN[layer]:
                bad.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert not bad, "\n".join(bad)
