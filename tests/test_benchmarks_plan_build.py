"""``benchmarks/plan_build.py`` runs end to end (one small row) and writes every method of
both forests and the ratios derived from them."""

import json

from tests.benchmark_scripts import run_benchmark


def test_quick_run_writes_a_complete_report(tmp_path):
    out = tmp_path / "plan_build.json"
    run_benchmark("plan_build", "--quick", "--rounds", "2", "--out", str(out))
    (row,) = json.loads(out.read_text())["rows"]
    steps = ("collate", "plan", "plan-complete", "hsa")
    forests = ("windows", "ragged")
    assert set(row["median_s"]) == {"flat"} | {f"{f}/{s}" for f in forests for s in steps}
    assert all(len(s) == 2 for s in row["samples_s"].values())
    assert row["tokens"] == sum(row["lengths"]) and len(row["lengths"]) == row["batch"]
    assert set(row["paths"]) == set(forests) and all(row["blocks"].values())
    median, derived = row["median_s"], row["derived"]["ragged"]
    plan = median["ragged/plan"]
    assert derived["complete_over_plan"] == median["ragged/plan-complete"] / plan
    assert derived["flat_over_hsa_and_plan"] == median["flat"] / (plan + median["ragged/hsa"])
    assert out.with_suffix(".png").stat().st_size > 0
    assert str(tmp_path) not in out.read_text()
