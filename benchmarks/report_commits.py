"""The report's section on two commits benchmarked side by side."""

from __future__ import annotations

import json

import report_results
from report_format import code, ratio, spread, table
from report_results import source


def compare_commits() -> list[str] | None:
    """One table per ``compare_commits*.json`` (the quick run, and runs at chosen HSA
    sizes)."""
    out = []
    for path in sorted(report_results.RESULTS.glob("compare_commits*.json")):
        data = json.loads(path.read_text())
        meta = data["meta"]
        _, _, sizes = meta["command"].partition("--hsa-sizes ")
        what = "quick benchmarks" if not sizes else (
            "benchmarks, the HSA scaling run at "
            + ", ".join(f"{int(n):,}" for n in sizes.split()) + " leaves,"
        )  # fmt: skip
        out += [
            f"The {what} of commit `{meta['old']}` (old) and `{meta['new']}` (new), "
            f"{meta['rounds']} interleaved rounds, each from its own checkout; cells are "
            f"medians [min–max]. Command: {code(meta['command'])}.",
            "",
        ]
        out += table(
            ["case", "old", "new", "old ÷ new"],
            [[r["case"], spread(r["old_s"]), spread(r["new_s"]), ratio(r["old_over_new"])]
             for r in data["rows"]],
        )  # fmt: skip
        out += [source(path.name), ""]
    return out or None
