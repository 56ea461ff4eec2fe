"""``benchmarks/hsa_lengths.py`` runs end to end (one small row) and writes every method,
the paths the default kernel took and the ratios to flat attention."""

import json

from tests.benchmark_scripts import run_benchmark


def test_quick_run_writes_a_complete_report(tmp_path):
    out = tmp_path / "hsa_lengths.json"
    run_benchmark("hsa_lengths", "--quick", "--rounds", "2", "--out", str(out))
    (row,) = json.loads(out.read_text())["rows"]
    causal = {"flat-causal", "hsa-causal", "hsa-causal-edges", "hsa-causal-ragged-trees",
              "hsa-causal-ragged-edges", "hsa-causal-ragged-torch"}  # fmt: skip
    methods = {"flat", "hsa", "hsa-torch", "hsa-blocks", "hsa-ragged-trees", *causal}
    assert set(row["median_s"]) == methods
    assert all(len(s) == 2 for s in row["samples_s"].values())
    assert row["tokens"] == sum(row["lengths"]) and len(row["lengths"]) == row["batch"]
    paths = ("forest kernel", "block kernel")  # with the kernels built, and without
    assert row["hsa_path"] in paths or row["hsa_path"].startswith("padded (")
    assert row["ragged_path"] in paths
    median = row["median_s"]
    assert row["flat_over"]["hsa"] == median["flat"] / median["hsa"]
    assert row["flat_over"]["hsa-causal"] == median["flat-causal"] / median["hsa-causal"]
    assert out.with_suffix(".png").stat().st_size > 0
    assert str(tmp_path) not in out.read_text()
