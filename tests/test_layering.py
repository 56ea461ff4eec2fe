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


def imported_modules(path: Path) -> set[str]:
    """Every module an ``import``/``from ... import`` anywhere in ``path`` names."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_lower_layers_never_import_higher_ones(layer):
    bad = []
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        for module in imported_modules(path):
            parts = module.split(".")
            if parts[0] == "hiergraph" and len(parts) > 1 and parts[1] in FORBIDDEN[layer]:
                bad.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert not bad, "\n".join(bad)
