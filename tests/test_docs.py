"""The README and the documentation pages: links, API coverage, CI commands, the first run.

The Sphinx build itself runs in CI (``sphinx-build -W -b html docs docs/_build/html``);
these checks are the cheap ones that need no Sphinx.
"""

from __future__ import annotations

import importlib
import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)]
PACKAGES = [
    "plan",
    "data",
    "ops",
    "nn",
    "masks",
    "datasets",
    "transforms",
    "loader",
    "integrations",
    "distributed",
    "runtime",
]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # not inside code blocks
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t) and t[0] != "#"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_point_to_files(page):
    missing = [
        target
        for target in _relative_links(page)
        if not (page.parent / target.split("#")[0]).exists()
    ]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_machine_paths_or_tracker_references(page):
    text = page.read_text()
    for pattern in (r"issue [0-9]", r"/tmp/", r"/work/", r"shared/notes", r"\.\./shared"):
        assert not re.search(pattern, text), f"{page.relative_to(ROOT)} contains {pattern!r}"


def test_readme_is_short_and_its_commands_are_what_ci_runs():
    readme = README.read_text()
    assert len(readme.splitlines()) <= 250
    ci = (ROOT / ".ci" / "run").read_text()
    pip = re.search(r'pip install "torch==[^"]+" -e "\.\[dev,[^"]*\]"', readme)
    assert pip and pip[0] in ci, "the README's full install command is not the one CI runs"
    for command in ("python -m pytest -n auto", "sphinx-build -W -b html docs docs/_build/html"):
        assert command in readme and command in ci


def test_every_package_has_an_api_page():
    documented = " ".join(p.read_text() for p in (DOCS / "api").glob("*.rst"))
    for name in PACKAGES:
        assert f".. automodule:: hiergraph.{name}\n" in documented, name
        module = importlib.import_module(f"hiergraph.{name}")
        for public in getattr(module, "__all__", []):
            assert hasattr(module, public), f"hiergraph.{name}.__all__ lists missing {public}"


def test_first_run_script_runs(capsys):
    main = runpy.run_path(str(DOCS / "first_run.py"))["main"]
    args = ["--steps", "5", "--train-size", "40", "--test-size", "20", "--long", "256"]
    results = main(args)
    assert set(results) == {"hsa", "flat", "op seconds"}
    assert 0.0 <= results["hsa"]["test accuracy"] <= 1.0
    assert "test accuracy" in capsys.readouterr().out
