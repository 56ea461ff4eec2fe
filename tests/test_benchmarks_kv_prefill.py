"""``benchmarks/kv_prefill.py`` runs end to end (two small prompts) and writes every method,
the ratios and the agreement of the prefilled and the appended caches."""

import json

from tests.benchmark_scripts import run_benchmark


def test_quick_run_writes_a_complete_report(tmp_path):
    out = tmp_path / "kv_prefill.json"
    run_benchmark("kv_prefill", "--quick", "--rounds", "3", "--out", str(out))
    report = json.loads(out.read_text())
    assert [r["length"] for r in report["rows"]] == [64, 128]
    for row in report["rows"]:
        median = row["median_s"]
        assert set(median) == {"prefill", "prefill_torch", "append", "append_torch", "flat"}
        assert all(len(s) == 3 for s in row["samples_s"].values())
        assert row["over_prefill"]["append"] == median["append"] / median["prefill"] > 0
        assert row["per_token_us"]["prefill"] == 1e6 * median["prefill"] / row["length"]
        assert row["max_abs_diff"] < 1e-5  # the same outputs, float32 rounding
    assert (
        report["meta"]["command"]
        == "python benchmarks/kv_prefill.py --threads 1 --rounds 3 --quick"
    )
    assert out.with_suffix(".png").stat().st_size > 0
    assert str(tmp_path) not in out.read_text()
