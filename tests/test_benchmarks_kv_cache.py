"""``benchmarks/kv_cache.py`` runs end to end (a few timed tokens per block) and writes
every cache and the reference step in every protocol, with their growth factors."""

import json

from tests.benchmark_scripts import run_benchmark


def test_quick_run_writes_every_method_and_protocol(tmp_path):
    out = tmp_path / "kv_cache.json"
    run_benchmark("kv_cache", "--quick", "--tokens", "4", "--out", str(out))
    result = json.loads(out.read_text())
    caches = ("hierarchical", "hierarchical_torch", "flat")
    methods = {*caches, *(f"{c}{p}" for c in (*caches, "torch_op") for p in ("_alone", "_evicted"))}
    rows = result["rows"]
    assert {r["method"] for r in rows} == methods
    assert sorted({r["context"] for r in rows}) == [1024, 2048, 4096]
    assert all(r["median_us"] > 0 and r["cpu_mean_us"] > 0 for r in rows)
    bytes_at = {(r["method"], r["context"]): r["bytes"] for r in rows}
    assert bytes_at["flat", 4096] > bytes_at["hierarchical", 4096] > 0
    assert bytes_at["hierarchical", 4096] == bytes_at["hierarchical_torch_evicted", 4096]
    assert bytes_at["torch_op_alone", 4096] == 0
    summary = result["summary"]
    assert summary["flat_bytes_growth_1024_to_4096"] == 4.0
    assert "torch_op_bytes_growth_1024_to_4096" not in summary
    assert result["meta"]["timed_tokens_per_context"] == 4
    assert out.with_suffix(".png").stat().st_size > 0
    assert str(tmp_path) not in out.read_text()
