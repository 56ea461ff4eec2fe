"""``benchmarks/hsa_short.py`` runs end to end (one small row, no inductor) and writes its
JSON report with every method, the ratios and the profile breakdown."""

import json

import torch

from tests.benchmark_scripts import run_benchmark


def test_quick_run_writes_a_complete_report(tmp_path):
    out = tmp_path / "hsa_short.json"
    run_benchmark("hsa_short", "--quick", "--no-compile", "--rounds", "3", "--out", str(out))
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    # which vector instructions ran: the kernel's speed depends on them
    assert report["meta"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    causal = {"flat-causal", "hsa-causal", "hsa-causal-heads-first", "hsa-causal-edges"}
    hsa = {"hsa", "hsa-torch", "hsa-heads-first", "hsa-blocks"}
    assert set(row["median_s"]) == {"flat", "bound", *hsa, *causal}
    assert all(len(s) == 3 for s in row["samples_s"].values())
    median = row["median_s"]
    assert row["flat_over"]["hsa"] == median["flat"] / median["hsa"] > 0
    profiles = row["profiles"]
    assert set(profiles) == {"hsa", "hsa-torch"}
    for profile in profiles.values():
        assert profile["aten_calls"] > 0 and sum(profile["self_cpu_s_by_group"].values()) > 0
    # the kernel is one call where the PyTorch operations are hundreds
    assert profiles["hsa"]["aten_calls"] < profiles["hsa-torch"]["aten_calls"] / 10
    assert out.with_suffix(".png").stat().st_size > 0
    assert str(tmp_path) not in out.read_text() and "/work" not in out.read_text()
