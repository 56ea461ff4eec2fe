"""``benchmarks/hsa_hubs.py`` runs end to end (one small row) and writes its JSON report with
every method and the ratios."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_quick_run_writes_a_complete_report(tmp_path):
    out = tmp_path / "hsa_hubs.json"
    command = [sys.executable, "benchmarks/hsa_hubs.py", "--quick", "--rounds", "3",
               "--threads", "1", "--hubs", "4", "--no-compile", "--out", str(out)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    equal, ragged = report["rows"]
    assert not equal["ragged"] and ragged["ragged"] and ragged["tokens"] < equal["tokens"]
    for row in (equal, ragged):
        assert set(row["median_s"]) == {"no-hubs", "hubs", "hubs-rebuilt"}
        assert all(len(s) == 3 for s in row["samples_s"].values())
        median = row["median_s"]
        assert row["rebuilt_over"]["hubs"] == median["hubs-rebuilt"] / median["hubs"] > 0
        assert row["hubs"] == 4 and row["compile_s"] is None
    assert "--hubs 4 --quick --no-compile" in report["meta"]["command"]
    assert out.with_suffix(".png").stat().st_size > 0
    assert str(tmp_path) not in out.read_text() and "/work" not in out.read_text()
