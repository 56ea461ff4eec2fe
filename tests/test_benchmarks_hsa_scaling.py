"""``benchmarks/hsa_scaling.py`` runs end to end (one size, no inductor, no memory runs)
and writes its JSON report with every method and the ratios to the bound."""

import json

from tests.benchmark_scripts import run_benchmark


def test_one_size_writes_a_complete_report(tmp_path):
    out = tmp_path / "scaling.json"
    run_benchmark(
        "hsa_scaling",
        "--sizes",
        "1024",
        "--reps",
        "1",
        "--no-memory",
        "--no-compile",
        "--out",
        str(out),
    )
    report = json.loads(out.read_text())
    methods = {r["method"] for r in report["rows"]}
    assert methods == {"hsa-window", "hsa-window-heads-first", "hsa-ragged", "bound", "flat-sdpa"}
    assert all(r["forward_s"] > 0 and r["forward_backward_s"] > 0 for r in report["rows"])
    by = {r["method"]: r["forward_backward_s"] for r in report["rows"]}
    summary = report["summary"]["1024"]
    assert summary["hsa_over_bound"] == by["hsa-window"] / by["bound"]
    assert "hsa_compiled_over_bound" not in summary
    assert report["meta"]["command"].endswith("--threads 1")  # --out and its path left out
    assert out.with_suffix(".png").stat().st_size > 0
    assert str(tmp_path) not in out.read_text()
