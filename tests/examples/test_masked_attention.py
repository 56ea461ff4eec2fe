"""examples/masked_attention.py: every mask trains and is scored."""

import pytest
import torch

MASKS = {"causal_window", "window", "causal", "full", "random"}


def test_every_mask_trains_and_is_scored(load_example, capsys):
    masked = load_example("masked_attention")
    results = masked.main(["--steps", "3", "--batch-size", "4", "--device", "cpu"])
    assert set(results) == MASKS
    assert all(0.0 <= a <= 1.0 for a in results.values())
    assert "causal_window: test accuracy" in capsys.readouterr().out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_masked_attention_runs_on_cuda(load_example):
    masked = load_example("masked_attention")
    results = masked.main(["--steps", "3", "--batch-size", "4", "--device", "cuda"])
    assert set(results) == MASKS
    assert all(0.0 <= a <= 1.0 for a in results.values())
