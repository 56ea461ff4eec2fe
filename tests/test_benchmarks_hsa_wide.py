"""``benchmarks/hsa_wide.py`` runs end to end (one small row) and writes its JSON report with
every method, the default path and the ratios to SDPA."""

import json

from tests.benchmark_scripts import run_benchmark


def test_quick_run_writes_a_complete_report(tmp_path):
    out = tmp_path / "hsa_wide.json"
    run_benchmark("hsa_wide", "--quick", "--rounds", "3", "--out", str(out))
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    assert row["leaves"] == 1024 and row["widest"] == 512 and row["path"] == "uniform"
    assert set(row["median_s"]) == {
        "hsa",
        "hsa-kernels",
        "hsa-torch",
        "hsa-blocks",
        "sdpa",
        "hsa-causal",
        "hsa-causal-kernel",
        "sdpa-causal",
    }
    assert all(len(s) == 3 for s in row["samples_s"].values())
    median = row["median_s"]
    assert row["over_sdpa"]["hsa"] == median["hsa"] / median["sdpa"] > 0
    assert row["over_sdpa"]["hsa-causal"] == median["hsa-causal"] / median["sdpa-causal"] > 0
    assert report["meta"]["wide_block"] == 512
    assert (
        report["meta"]["command"] == "python benchmarks/hsa_wide.py --threads 1 --rounds 3 --quick"
    )
    assert out.with_suffix(".png").stat().st_size > 0
    assert str(tmp_path) not in out.read_text() and "/work" not in out.read_text()
