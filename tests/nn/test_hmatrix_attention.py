"""HMatrixAttention module and the HTransformer1D encoder / language model."""

import pytest
import torch
from torch import nn

from hiergraph.nn.hmatrix_attention import HMatrixAttention
from hiergraph.nn.htransformer1d import HTransformer1D


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
    with pytest.raises(ValueError, match=r"\[batch, length, 32\]"):
        attn(torch.randn(50, 32))


def test_language_model_is_causal_and_trains():
    torch.manual_seed(0)
    model = HTransformer1D(20, embed_dim=32, depth=2, num_heads=4, block_size=4, causal=True)
    tokens = torch.randint(0, 20, (2, 70))
    logits = model(tokens)
    assert logits.shape == (2, 70, 20)
    changed = tokens.clone()
    changed[:, 40:] = (changed[:, 40:] + 1) % 20
    torch.testing.assert_close(model(changed)[:, :40], logits[:, :40])
    loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 20), tokens[:, 1:].reshape(-1))
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_encoder_ignores_padded_tokens():
    torch.manual_seed(0)
    model = HTransformer1D(10, embed_dim=16, depth=2, num_heads=2, block_size=4, lm_head=False)
    tokens = torch.randint(0, 10, (1, 30))
    mask = torch.zeros(1, 30, dtype=torch.bool)
    mask[:, 25:] = True
    out = model(tokens, mask)
    assert out.shape == (1, 30, 16)
    other = tokens.clone()
    other[:, 25:] = (other[:, 25:] + 3) % 10
    torch.testing.assert_close(model(other, mask)[:, :25], out[:, :25])
    with pytest.raises(ValueError, match="int64"):
        model(tokens.float())
