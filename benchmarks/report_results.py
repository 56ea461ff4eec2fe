"""The result files under ``benchmarks/results/``: reading them, linking them and their plots."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def load(name: str) -> dict | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def present(items):
    """``(item, data)`` for every result file of ``items`` that exists (an item is a file
    name or a tuple whose first element is one)."""
    for item in items:
        data = load(item if isinstance(item, str) else item[0])
        if data is not None:
            yield item, data


def plot(name: str, alt: str) -> list[str]:
    return [f"![{alt}](results/{name})", ""] if (RESULTS / name).exists() else []


def links(*names: str) -> str:
    """Links to the result files ``names`` that exist."""
    return ", ".join(f"[`{n}`](results/{n})" for n in names if (RESULTS / n).exists())


def source(*names: str) -> str:
    return f"Source: {links(*names)}."


def merged(name: str, plot_name: str, alt: str) -> list[str]:
    """The lines that close a section whose runs a benchmark's ``report`` step merged into
    the file ``name`` and plotted from it."""
    return [f"Merged into one file: {links(name)}.", ""] + plot(plot_name, alt)


def sourced(name: str, alt: str) -> list[str]:
    """The lines that close a section on the result file ``name``: its source, and the plot
    its benchmark wrote beside it (the same name, ``.png``) where there is one."""
    return [source(name), ""] + plot(name.replace(".json", ".png"), alt)
