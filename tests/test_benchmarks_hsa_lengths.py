"""``benchmarks/hsa_lengths.py`` runs end to end (one small row) and writes every method,
the forest it embedded and the ratios to flat attention."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_quick_run_writes_a_complete_report(tmp_path):
    out = tmp_path / "hsa_lengths.json"
    command = [sys.executable, "benchmarks/hsa_lengths.py", "--quick", "--rounds", "2",
               "--threads", "1", "--out", str(out)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    causal = {"flat-causal", "hsa-causal", "hsa-causal-edges"}
    assert set(row["median_s"]) == {"flat", "hsa", "hsa-blocks", "hsa-ragged-trees", *causal}
    assert all(len(s) == 2 for s in row["samples_s"].values())
    assert row["tokens"] == sum(row["lengths"]) and len(row["lengths"]) == row["batch"]
    assert row["padded_slots"] >= row["tokens"]  # this row's forest is embedded
    median = row["median_s"]
    assert row["flat_over"]["hsa"] == median["flat"] / median["hsa"]
    assert row["flat_over"]["hsa-causal"] == median["flat-causal"] / median["hsa-causal"]
    assert out.with_suffix(".png").stat().st_size > 0
    assert str(tmp_path) not in out.read_text()
