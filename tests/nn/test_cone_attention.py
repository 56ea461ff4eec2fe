"""ConeAttention: dense reference, nn.MultiheadAttention call conventions, masks, drop-in use."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hiergraph.nn.cone_attention import ConeAttention
from hiergraph.ops.cone import penumbral, umbral

B, L, S, E, HEADS = 2, 5, 6, 12, 3


def inputs(dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, n, E, generator=gen, dtype=dtype) for n in (L, S, S))


def reference(att, query, key, value, allowed, additive=0.0):
    """Per-head loop: softmax over allowed keys of cone logits (+ additive mask)."""
    q, k, v = att.q_proj(query), att.k_proj(key), att.v_proj(value)
    heads, weights = [], []
    for h in range(HEADS):
        cols = slice(h * att.head_dim, (h + 1) * att.head_dim)
        score_fn = penumbral if att.variant == "penumbral" else umbral
        logits = score_fn(q[..., cols], k[..., cols]) + (
            additive[:, h] if torch.is_tensor(additive) else additive
        )
        w = logits.masked_fill(~allowed, float("-inf")).softmax(-1)
        heads.append(w @ v[..., cols])
        weights.append(w)
    return att.out_proj(torch.cat(heads, dim=-1)), torch.stack(weights, dim=1)


@pytest.mark.parametrize("variant", ["penumbral", "umbral"])
def test_matches_reference_with_bool_masks(variant):
    torch.manual_seed(0)
    att = ConeAttention(E, HEADS, variant=variant).double()
    query, key, value = inputs()
    attn_mask = torch.rand(L, S) > 0.7
    attn_mask[:, 0] = False
    key_padding_mask = torch.zeros(B, S, dtype=torch.bool)
    key_padding_mask[1, -2:] = True
    out, w = att(
        query, key, value, key_padding_mask, attn_mask=attn_mask, average_attn_weights=False
    )
    allowed = ~attn_mask[None, None] & ~key_padding_mask[:, None, None, :]
    ref_out, ref_w = reference(att, query, key, value, allowed[:, 0])
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w, ref_w)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, HEADS, L, dtype=torch.float64))


def test_float_and_per_head_masks():
    torch.manual_seed(1)
    att = ConeAttention(E, HEADS).double()
    query, key, value = inputs()
    float_mask = torch.randn(B * HEADS, L, S, dtype=torch.float64)
    out, w = att(query, key, value, attn_mask=float_mask, average_attn_weights=False)
    allowed = torch.ones(B, L, S, dtype=torch.bool)
    ref_out, ref_w = reference(
        att, query, key, value, allowed, additive=float_mask.view(B, HEADS, L, S)
    )
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w, ref_w)


def test_causal_and_average_weights():
    att = ConeAttention(E, HEADS).double()
    x = inputs()[0]
    out, w = att(x, x, x, is_causal=True)
    assert w.shape == (B, L, L)
    assert (w.triu(diagonal=1) == 0).all()
    _, per_head = att(x, x, x, is_causal=True, average_attn_weights=False)
    assert per_head.shape == (B, HEADS, L, L)
    torch.testing.assert_close(w, per_head.mean(1))
    causal = nn.Transformer.generate_square_subsequent_mask(L, dtype=torch.float64)
    out2, _ = att(x, x, x, attn_mask=causal)
    torch.testing.assert_close(out, out2)


def test_fully_masked_row_gives_zero_weights_and_finite_grads():
    att = ConeAttention(E, HEADS)
    query, key, value = (t.float().requires_grad_() for t in inputs())
    attn_mask = torch.zeros(L, S, dtype=torch.bool)
    attn_mask[2] = True
    out, w = att(query, key, value, attn_mask=attn_mask)
    assert (w[:, 2] == 0).all()
    torch.testing.assert_close(out[:, 2], att.out_proj.bias.expand(B, E))
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (query, key, value))


@pytest.mark.parametrize("empty", ["sequence", "keys", "batch"])
def test_empty_inputs_give_the_shapes_of_multihead_attention(empty):
    """A drop-in for ``nn.MultiheadAttention`` returns what it returns on empty inputs: an
    empty sequence or batch gives empty outputs, no keys give the bias alone."""
    sizes = {"sequence": (2, 0, 5), "keys": (2, 3, 0), "batch": (0, 3, 5)}[empty]
    batch, length, keys = sizes
    query, key = torch.randn(batch, length, 16), torch.randn(batch, keys, 16)
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    torch.manual_seed(0)
    att = ConeAttention(16, 2)
    out, w = att(query, key, key)
    want, want_w = mha(query, key, key)
    assert out.shape == want.shape and w.shape == want_w.shape
    if empty == "keys":
        torch.testing.assert_close(out, att.out_proj.bias.expand_as(out))


def test_need_weights_unbatched_and_kdim_vdim():
    att = ConeAttention(E, HEADS, kdim=7, vdim=5, variant="umbral")
    out, w = att(
        torch.randn(B, L, E), torch.randn(B, S, 7), torch.randn(B, S, 5), need_weights=False
    )
    assert out.shape == (B, L, E) and w is None
    out, w = att(torch.randn(L, E), torch.randn(S, 7), torch.randn(S, 5))
    assert out.shape == (L, E) and w.shape == (L, S)


@pytest.mark.parametrize("variant", ["penumbral", "umbral"])
def test_drop_in_for_transformer_encoder_layer(variant):
    torch.manual_seed(2)
    layer = nn.TransformerEncoderLayer(E, HEADS, dim_feedforward=16, batch_first=True)
    layer.self_attn = ConeAttention(E, HEADS, dropout=0.1, variant=variant)
    encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    x = torch.randn(B, L, E)
    padding = torch.zeros(B, L, dtype=torch.bool)
    padding[0, -1] = True
    causal = nn.Transformer.generate_square_subsequent_mask(L).isinf()
    y = encoder(x, mask=causal, src_key_padding_mask=padding)
    y.sum().backward()
    assert torch.isfinite(y).all()
    encoder.eval()  # eval must not take PyTorch's native MHA fast path
    with torch.no_grad():
        y_eval = encoder(x, mask=causal, src_key_padding_mask=padding)
        manual = x
        for mod in encoder.layers:
            manual = mod.norm1(
                manual + mod.self_attn(manual, manual, manual, padding, False, causal)[0]
            )
            manual = mod.norm2(manual + mod.linear2(mod.activation(mod.linear1(manual))))
    torch.testing.assert_close(y_eval, manual)


@pytest.mark.parametrize("variant", ["penumbral", "umbral"])
def test_scores_in_float32_under_autocast(variant):
    torch.manual_seed(3)
    att = ConeAttention(E, HEADS, variant=variant)
    query, key, value = (t.float().requires_grad_() for t in inputs())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, w = att(query, key, value, average_attn_weights=False)
    assert w.dtype == torch.float32
    torch.testing.assert_close(w.sum(-1), torch.ones(B, HEADS, L))
    out.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (query, key, value))


def test_bad_arguments():
    with pytest.raises(ValueError, match="not divisible"):
        ConeAttention(10, 3)
    with pytest.raises(ValueError, match=">= 2"):
        ConeAttention(4, 4)
    with pytest.raises(ValueError, match="variant must be one of"):
        ConeAttention(E, HEADS, variant="dot")
    att = ConeAttention(E, HEADS)
    query, key, value = (t.float() for t in inputs())
    with pytest.raises(ValueError, match="batch first"):
        att(query, key[..., :5], value)
    with pytest.raises(ValueError, match="attn_mask must have shape"):
        att(query, key, value, attn_mask=torch.zeros(S, L, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_padding_mask must have shape"):
        att(query, key, value, key_padding_mask=torch.zeros(B, L, dtype=torch.bool))
    meta = torch.zeros(B, S, dtype=torch.bool, device="meta")  # (a device error inside torch)
    with pytest.raises(ValueError, match="key_padding_mask is on meta but query is on cpu"):
        att(query, key, value, key_padding_mask=meta)
    with pytest.raises(ValueError, match="share the batch size"):
        att(query, key[:1], value[:1])
    for bad in (torch.uint8, torch.long):  # a 0/1 integer mask must not be added to the logits
        with pytest.raises(TypeError, match="key_padding_mask must be bool .* or floating"):
            att(query, key, value, key_padding_mask=torch.zeros(B, S, dtype=bad))


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((8, 0), {}, "num_heads must be a positive int, got 0"),
        ((0, 2), {}, "embed_dim must be a positive int, got 0"),
        ((8, 2), {"kdim": 0}, "kdim must be a positive int or None"),
        ((8, 2), {"vdim": -4}, "vdim must be a positive int or None"),
        ((8, 2), {"dropout": -0.1}, "dropout must be a probability"),
        ((8, 2), {"gamma": 0.0}, "gamma must be a finite number > 0"),
        ((8, 2), {"r": 0.0}, "r must be a finite number > 0"),  # (before: at the first forward)
        ((8, 2), {"r": float("inf")}, "r must be a finite number > 0"),
        ((8, 2), {"gamma": float("inf")}, "gamma must be a finite number > 0, got inf"),
        ((8, 2), {"height_scale": 0.0}, "height_scale must be a finite number > 0"),
    ],
)
def test_constructor_rejects_bad_arguments(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ConeAttention(*args, **kwargs)


def test_wrong_feature_sizes_name_expected_and_actual():
    att = ConeAttention(8, 2, kdim=6)
    x = torch.randn(5, 8)
    with pytest.raises(
        ValueError, match=r"query must be .*\[seq, 8\]: 8 features, got shape \(5, 7\)"
    ):
        att(torch.randn(5, 7), torch.randn(5, 6), x)
    with pytest.raises(ValueError, match=r"key must be .*6 features, got shape \(2, 5, 8\)"):
        att(x.expand(2, 5, 8), x.expand(2, 5, 8), x.expand(2, 5, 8))


def test_repr():
    assert (
        repr(ConeAttention(8, 2, variant="umbral"))
        == "ConeAttention(8, num_heads=2, variant='umbral')"
    )
