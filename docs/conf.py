"""Sphinx configuration of the hiergraph documentation.

Build (warnings are errors, as in CI)::

    pip install -e ".[docs]"
    sphinx-build -W -b html docs docs/_build/html
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # document the checkout even without `pip install -e .`

import hiergraph  # noqa: E402

project = "hiergraph"
author = "the hiergraph authors"
copyright = "the hiergraph authors"
release = version = hiergraph.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# MyST: $...$ / $$...$$ math, ::: fences, heading anchors for [text](page.md#anchor) links.
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3

# autodoc: signatures as written, type hints next to the argument descriptions.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_inherit_docstrings = False  # nn.Module's own docstrings are not ours to render
add_module_names = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # "Attributes:" as fields, not a second copy of dataclass fields

html_theme = "alabaster"
html_title = f"hiergraph {release}"
html_theme_options = {
    "description": "Attention over hierarchical and relational structure for PyTorch Geometric",
    "fixed_sidebar": True,
    "page_width": "1200px",
    "sidebar_width": "260px",
}
html_static_path: list[str] = []
