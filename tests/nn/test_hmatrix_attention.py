"""HMatrixAttention: multi-head H-matrix attention layer."""

import numpy as np
import pytest
import torch
from torch import nn

from hiergraph.nn.hmatrix_attention import HMatrixAttention


def _as_multihead(attn: HMatrixAttention) -> nn.MultiheadAttention:
    mha = nn.MultiheadAttention(attn.embed_dim, attn.num_heads, batch_first=True)
    mha.in_proj_weight.data.copy_(attn.in_proj.weight)
    mha.in_proj_bias.data.copy_(attn.in_proj.bias)
    mha.out_proj.load_state_dict(attn.out_proj.state_dict())
    return mha.double()


@pytest.mark.parametrize("causal", [False, True])
def test_equals_multihead_attention_when_one_level(causal):
    torch.manual_seed(0)
    attn = HMatrixAttention(16, 4, block_size=8, causal=causal).double()
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[1, 9:] = True
    mha = _as_multihead(attn)
    causal_mask = torch.ones(12, 12).triu(1).bool() if causal else None
    expected, _ = mha(x, x, x, key_padding_mask=mask, attn_mask=causal_mask, need_weights=False)
    out = attn(x, key_padding_mask=mask)
    torch.testing.assert_close(out[~mask], expected[~mask])


def test_module_shapes_and_errors():
    attn = HMatrixAttention(32, 4, block_size=4)
    assert attn(torch.randn(3, 50, 32)).shape == (3, 50, 32)
    assert "block_size=4" in repr(attn)
    with pytest.raises(ValueError, match="divisible"):
        HMatrixAttention(30, 4)
    with pytest.raises(ValueError, match="num_heads must be a positive int"):
        HMatrixAttention(32, 0)  # (a ZeroDivisionError before)
    with pytest.raises(ValueError, match="block_size must be an even int"):
        HMatrixAttention(32, 4, block_size=3)  # (before: at the first forward)
    with pytest.raises(TypeError, match="causal must be a bool"):
        HMatrixAttention(32, 4, causal="yes")
    with pytest.raises(TypeError, match="bias must be a bool, got 'no'"):
        HMatrixAttention(32, 4, bias="no")  # (learned a bias)
    with pytest.raises(ValueError, match=r"\[batch, length, 32\]"):
        attn(torch.randn(50, 32))
    assert attn(torch.randn(3, 0, 32)).shape == (3, 0, 32)  # as MultiheadAttention


def test_numpy_integer_block_size():
    """``block_size=np.int64(4)`` was refused ("block_size must be an int, got int64"), unlike
    every other size."""
    attn = HMatrixAttention(np.int64(16), np.int64(2), block_size=np.int64(4))
    assert type(attn.block_size) is int and attn.block_size == 4
    x = torch.randn(2, 9, 16)
    reference = HMatrixAttention(16, 2, block_size=4)
    reference.load_state_dict(attn.state_dict())
    assert torch.equal(attn(x), reference(x))
