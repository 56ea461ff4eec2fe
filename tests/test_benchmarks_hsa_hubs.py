"""``benchmarks/hsa_hubs.py`` runs end to end (one small row) and writes its JSON report with
every method and the ratios."""

import json

from tests.benchmark_scripts import run_benchmark


def test_quick_run_writes_a_complete_report(tmp_path):
    out = tmp_path / "hsa_hubs.json"
    run_benchmark(
        "hsa_hubs", "--quick", "--rounds", "3", "--hubs", "4", "--no-compile", "--out", str(out)
    )
    report = json.loads(out.read_text())
    equal, ragged, mixed = report["rows"]
    assert not equal["ragged"] and ragged["ragged"] and ragged["tokens"] < equal["tokens"]
    assert [row["runs_on"] for row in report["rows"]] == ["plan", "embedding", "levels"]
    for row in (equal, ragged, mixed):
        assert set(row["median_s"]) == {"no-hubs", "hubs", "hubs-rebuilt"}
        assert all(len(s) == 3 for s in row["samples_s"].values())
        median = row["median_s"]
        assert row["rebuilt_over"]["hubs"] == median["hubs-rebuilt"] / median["hubs"] > 0
        assert row["hubs"] == 4 and row["compile_s"] is None
    assert "--hubs 4 --quick --no-compile" in report["meta"]["command"]
    assert out.with_suffix(".png").stat().st_size > 0
    assert str(tmp_path) not in out.read_text() and "/work" not in out.read_text()
