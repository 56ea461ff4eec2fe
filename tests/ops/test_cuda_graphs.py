"""CUDA-graph capture of every op: ``tests/ops/cuda_graph_cases.py`` in its own process
(a broken capture can leave a CUDA context unusable), and its harness on the CPU."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.ops import cuda_graph_cases

REPO = Path(__file__).resolve().parents[2]


def test_harness_runs_every_case_eagerly_on_the_cpu(capsys):
    assert cuda_graph_cases.main(["--eager"]) == 0
    lines = capsys.readouterr().out.splitlines()
    cases = len(cuda_graph_cases.CASES) * len(cuda_graph_cases.DTYPES)
    assert sum(line.startswith("OK ") for line in lines) == cases


def test_mismatch_reports_errors_beyond_the_tolerance_and_non_finite_values():
    want = torch.tensor([1.0, -2.0])
    assert cuda_graph_cases.mismatch(want + 1e-6, want, torch.float32) is None
    assert "max error 0.1" in cuda_graph_cases.mismatch(want + 0.1, want, torch.float32)
    assert cuda_graph_cases.mismatch(want + 0.01, want, torch.bfloat16) is None
    nan = torch.tensor([float("nan"), 0.0])
    assert cuda_graph_cases.mismatch(nan, want, torch.float32) == "non-finite values"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_every_op_replays_as_a_cuda_graph():
    done = subprocess.run(
        [sys.executable, "-m", "tests.ops.cuda_graph_cases"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    failed = [line for line in lines if line.startswith("FAIL")]
    started = [line.removeprefix("START ") for line in lines if line.startswith("START")]
    ended = [line for line in lines if line.startswith(("OK", "FAIL"))]
    if len(ended) < len(started):  # the process died inside a case
        failed.append(f"crashed in {started[-1]}: {done.stderr.strip().splitlines()[-1:]}")
    assert not failed, "\n".join(failed)
