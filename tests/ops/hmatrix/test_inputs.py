"""Checks of H-matrix attention's inputs (:mod:`hiergraph.ops.hmatrix.inputs`)."""

import pytest
import torch

from hiergraph.ops.hmatrix import hmatrix_attention


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"block_size": 3}, ValueError, "even"),
        ({"block_size": 0}, ValueError, "even"),
        ({"block_size": 4.0}, TypeError, "int"),
        ({"q": torch.randn(2, 10, 4)}, ValueError, r"\[batch, heads, length, dim\]"),
        ({"k": torch.randn(1, 2, 9, 4)}, ValueError, "same shape"),
        ({"v": torch.randn(1, 2, 9, 4)}, ValueError, "must match q"),
        ({"v": torch.ones(1, 2, 10, 4, dtype=torch.long)}, TypeError, "floating"),
        ({"key_padding_mask": torch.zeros(1, 10)}, ValueError, "bool"),
        ({"key_padding_mask": torch.zeros(1, 9, dtype=torch.bool)}, ValueError, "shape"),
        ({"key_padding_mask": [[False] * 10]}, TypeError, "bool tensor, got list"),
        (  # (a meta-tensor copy error)
            {"key_padding_mask": torch.zeros(1, 10, dtype=torch.bool, device="meta")},
            ValueError,
            "key_padding_mask is on meta but q is on cpu",
        ),
        ({"q": torch.randn(1, 2, 10, 0), "k": torch.randn(1, 2, 10, 0)}, ValueError, "channel"),
        ({"causal": "no"}, TypeError, "causal must be a bool"),  # (it was causal)
    ],
)
def test_bad_inputs(kwargs, error, match):
    args = {"q": torch.randn(1, 2, 10, 4), "k": torch.randn(1, 2, 10, 4),
            "v": torch.randn(1, 2, 10, 4), "block_size": 4} | kwargs  # fmt: skip
    with pytest.raises(error, match=match):
        hmatrix_attention(**args)
