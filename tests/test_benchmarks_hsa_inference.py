"""``benchmarks/hsa_inference.py`` runs end to end (two small rows, one padded) and writes its
JSON report with every method, the ratios and the outputs' agreement."""

import json

from tests.benchmark_scripts import run_benchmark


def test_quick_run_writes_a_complete_report(tmp_path):
    out = tmp_path / "hsa_inference.json"
    run_benchmark("hsa_inference", "--quick", "--rounds", "3", "--out", str(out))
    report = json.loads(out.read_text())
    trees, padded = report["rows"]
    assert set(trees["median_s"]) == {"flat", "hsa", "hsa-torch", "hsa-heads-first", "hsa-recorded"}
    assert set(padded["median_s"]) == {"flat", "hsa", "hsa-recorded"}
    assert padded["lengths"] and trees["lengths"] is None
    for row in (trees, padded):
        assert all(len(s) == 3 for s in row["samples_s"].values())
        median = row["median_s"]
        assert row["recorded_over"]["hsa"] == median["hsa-recorded"] / median["hsa"] > 0
        assert row["flat_over"]["hsa"] == median["flat"] / median["hsa"] > 0
        assert row["max_abs_diff_vs_recorded"] < 1e-5  # the same output, float32 rounding
    assert out.with_suffix(".png").stat().st_size > 0
    assert str(tmp_path) not in out.read_text() and "/work" not in out.read_text()
