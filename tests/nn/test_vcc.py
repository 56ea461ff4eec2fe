"""VCCEncoder: exactness without compression, permutation, padding, batching, gradients."""

import pytest
import torch
from torch import nn

from hiergraph.nn.vcc import VCCEncoder, query_key, run_layer
from tests.conftest import assert_same_gradients
from tests.ops.vcc.test_layer import HEADS, D, _batch


def _inputs(lengths=(23, 11, 17), num_vip=(3, 1, 0), seed=0):
    return _batch(lengths, num_vip, seed)


def _encoder(num_layers=2, seed=0, **kwargs):
    torch.manual_seed(seed)
    return VCCEncoder(num_layers, D, HEADS, 16, **kwargs).double()


def _full(layers, x, mask):
    key_bias = torch.zeros(mask.shape, dtype=x.dtype).masked_fill(~mask, float("-inf"))
    for layer in layers:
        x = run_layer(layer, x, key_bias)
    return x * mask[..., None]


@pytest.mark.parametrize(
    "kwargs",
    [dict(block_size=4, num_refined=100), dict(branching=(2, 3), budgets=(None, None, None))],
)
def test_no_compression_equals_full_layers(kwargs):
    x, vip, mask = _inputs()
    enc = _encoder(**kwargs)
    torch.testing.assert_close(enc(x, vip, mask), _full(enc.layers, x, mask), rtol=0, atol=1e-12)


@pytest.mark.parametrize("norm_first", [True, False])
def test_run_layer_is_the_layer_with_a_float_key_bias(norm_first):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(D, HEADS, 16, 0.0, batch_first=True, norm_first=norm_first)
    layer = layer.double()
    z = torch.randn(2, 7, D, dtype=torch.float64)
    bias = torch.randn(2, 7, dtype=torch.float64)
    bias[1, 5:] = float("-inf")
    torch.testing.assert_close(run_layer(layer, z, bias), layer(z, src_key_padding_mask=bias))


def test_eval_mode_keeps_the_multiplicity_bias():
    """PyTorch's inference fast path would drop the float key bias; VCC turns it off."""
    x, vip, mask = _inputs()
    enc = _encoder(block_size=4, num_refined=1)
    train = enc(x, vip, mask)
    with torch.no_grad():
        torch.testing.assert_close(enc.eval()(x, vip, mask), train, rtol=0, atol=1e-12)
    assert torch.backends.mha.get_fastpath_enabled()  # restored


def test_identical_tokens_in_blocks_are_exact_without_refinement():
    x, vip, mask = _inputs(lengths=(20, 14), num_vip=(2, 2))
    k = 4
    for b in range(2):
        other = (mask[b] & ~vip[b]).nonzero().squeeze(1)
        x[b, other] = x[b, other[(torch.arange(other.numel()) // k) * k]]
    enc = _encoder(1, block_size=k, num_refined=0)
    torch.testing.assert_close(enc(x, vip, mask), _full(enc.layers, x, mask), rtol=0, atol=1e-12)


def test_moving_vip_tokens_leaves_outputs_unchanged():
    """With positions folded into x, where the VIP tokens sit does not matter."""
    x, vip, mask = _inputs(lengths=(23,), num_vip=(3,))
    enc = _encoder(block_size=4, num_refined=2)
    out = enc(x, vip, mask)
    vip_rows, other_rows = vip[0].nonzero().squeeze(1), (~vip[0]).nonzero().squeeze(1)
    new_vip_pos = torch.tensor([22, 0, 9])
    order = torch.full((23,), -1)
    order[new_vip_pos] = vip_rows
    order[order < 0] = other_rows
    vip2 = torch.zeros_like(vip)
    vip2[0, new_vip_pos] = True
    out2 = enc(x[:, order], vip2, mask)
    torch.testing.assert_close(out2[:, order.argsort()], out, rtol=0, atol=1e-12)


def test_batch_equals_single_sequences_and_padding_is_inert():
    x, vip, mask = _inputs()
    enc = _encoder(block_size=3, num_refined=2, local_layers=1, local_size=8)
    out = enc(x, vip, token_mask=mask)  # token_mask: True = real token
    assert (out[~mask] == 0).all()
    for b in range(3):
        n = int(mask[b].sum())
        single = enc(x[b : b + 1, :n], vip[b : b + 1, :n])
        torch.testing.assert_close(out[b : b + 1, :n], single, rtol=0, atol=1e-12)
    for fill in (100.0, float("nan"), float("inf")):  # padding never reaches real tokens
        x2 = x.clone()
        x2[~mask] = fill
        torch.testing.assert_close(enc(x2, vip, mask), out, rtol=0, atol=1e-12)


@pytest.mark.parametrize("shape", [(0, 10), (2, 0)])
def test_empty_batches_give_empty_outputs(shape):
    x = torch.randn(*shape, D, dtype=torch.float64)
    for slots in (None, 2):
        enc = _encoder(1, block_size=3, num_refined=1, vip_slots=slots, local_layers=1)
        out = enc(x, torch.zeros(shape, dtype=torch.bool))
        assert out.shape == x.shape


def test_local_layers_run_per_window_on_the_original_order():
    x, vip, mask = _inputs(lengths=(20,), num_vip=(2,))
    enc = _encoder(1, block_size=2, num_refined=100, local_layers=1, local_size=8)
    windows = [x[:, i : i + 8] for i in range(0, 20, 8)]
    local = torch.cat(
        [_full(enc.local_layers, w, torch.ones(w.shape[:2], dtype=torch.bool)) for w in windows], 1
    )
    torch.testing.assert_close(
        enc(x, vip, mask), _full(enc.layers, local, mask), rtol=0, atol=1e-12
    )


def test_vip_error_falls_with_budget():
    gen = torch.Generator().manual_seed(1)
    n = 128
    x = torch.cumsum(torch.randn(1, n, D, generator=gen, dtype=torch.float64), 1) * 0.3
    vip = torch.zeros(1, n, dtype=torch.bool)
    vip[0, :4] = True
    enc = _encoder(1, block_size=4)
    with torch.no_grad():
        enc.layers[0].self_attn.in_proj_weight[: 2 * D] *= 4  # peaked attention
    full = _full(enc.layers, x, torch.ones_like(vip))
    errors = []
    for h in (0, 6, 16, 31):
        enc.budgets = (None, h)
        errors.append(((enc(x, vip) - full)[vip].norm() / (full - x)[vip].norm()).item())
    assert errors[0] > errors[1] > errors[2] > errors[3] and errors[3] < 1e-12


def test_gradients():
    x, vip, mask = _inputs(lengths=(10, 7), num_vip=(2, 1))
    weight = torch.randn_like(x)
    x.requires_grad_()
    enc = _encoder(1, block_size=2, num_refined=100)  # no compression: the full layer's gradients
    out, ref = enc(x, vip, mask), _full(enc.layers, x, mask)
    assert_same_gradients(out, ref, [x, *enc.parameters()], weight, rtol=0, atol=1e-12)
    enc.budgets = (None, 1)  # compressed: every parameter still gets a finite gradient
    grads = torch.autograd.grad((enc(x, vip, mask) * weight).sum(), [x, *enc.parameters()])
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


class CustomLayer(nn.Module):
    """A pre-LN layer with the custom-layer protocol: forward(z, key_bias), query_key(x)."""

    def __init__(self):
        super().__init__()
        self.inner = nn.TransformerEncoderLayer(
            D, HEADS, 16, 0.0, batch_first=True, norm_first=True
        )

    def forward(self, z, key_bias):
        return run_layer(self.inner, z, key_bias)

    def query_key(self, x):
        return query_key(self.inner, x, "q"), query_key(self.inner, x, "k")


def test_custom_layers_and_repr():
    x, vip, mask = _inputs()
    torch.manual_seed(0)
    custom = [CustomLayer().double() for _ in range(2)]
    enc = VCCEncoder(custom, block_size=3, num_refined=2)
    ref = VCCEncoder([c.inner for c in custom], block_size=3, num_refined=2)
    before = ref(x, vip, mask)
    torch.testing.assert_close(enc(x, vip, mask), before, rtol=0, atol=1e-12)
    assert "budgets=(None, 2)" in repr(enc)
    enc.reset_parameters()
    after = enc(x, vip, mask)
    assert torch.isfinite(after).all() and not torch.allclose(after, before)


def test_reset_parameters_calls_a_custom_layers_own():
    """A custom layer's own parameters were left as they were (only its submodules'
    ``reset_parameters`` ran)."""

    class Scaled(CustomLayer):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(()))

        def reset_parameters(self):
            self.inner.self_attn._reset_parameters()
            nn.init.zeros_(self.scale)

    enc = VCCEncoder([Scaled()], block_size=3)
    enc.reset_parameters()
    assert enc.layers[0].scale.item() == 0.0


def test_bad_inputs():
    x, vip, mask = _inputs()
    enc = _encoder(block_size=3)
    with pytest.raises(TypeError, match="bool"):
        enc(x, vip.float(), mask)
    with pytest.raises(ValueError, match="padded positions"):
        enc(x, vip | ~mask, mask)
    with pytest.raises(ValueError, match="shape"):
        enc(x, vip[:, 1:], mask)
    with pytest.raises(ValueError, match="vip_mask is on meta but x is on cpu"):  # (torch's)
        enc(x, vip.to("meta"), mask)
    with pytest.raises(ValueError, match="norm_first"):
        VCCEncoder([nn.TransformerEncoderLayer(D, HEADS, batch_first=True)])
    with pytest.raises(TypeError, match="query_key"):
        VCCEncoder([nn.Linear(D, D)])
    with pytest.raises(ValueError, match="embed_dim"):
        VCCEncoder(2)
    with pytest.raises(ValueError, match="budgets"):
        VCCEncoder(1, D, HEADS, branching=(2, 2), budgets=(None, 1))
    with pytest.raises(ValueError, match="num_refined must be an int >= 0, got -1"):
        VCCEncoder(1, D, HEADS, num_refined=-1)
    with pytest.raises(ValueError, match="each budget must be an int >= 0"):
        VCCEncoder(1, D, HEADS, branching=(2,), budgets=(None, -1))
    with pytest.raises(ValueError, match="block_size must be an int >= 2, got 1"):
        VCCEncoder(1, D, HEADS, block_size=1)
    with pytest.raises(ValueError, match="local_size"):
        VCCEncoder(1, D, HEADS, local_size=0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_heads=0), "num_heads must be a positive int, got 0"),
        (dict(embed_dim=0), "embed_dim must be a positive int or None"),
        (dict(ff_dim=0), "ff_dim must be a positive int or None"),
        (dict(dropout=2.0), "dropout must be a probability"),
        (dict(block_size=0), "block_size must be an int >= 2"),
        (dict(vip_slots=-1), "vip_slots must be an int >= 0 or None"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, match):
    kwargs = {"embed_dim": D, "num_heads": HEADS, **kwargs}
    with pytest.raises(ValueError, match=match):
        VCCEncoder(1, **kwargs)


def test_wrong_feature_size_names_expected_and_actual():
    x, vip, mask = _inputs()
    enc = _encoder(1)
    with pytest.raises(ValueError, match=rf"x must have {D} features .*got {D + 1}"):
        enc(torch.cat([x, x[..., :1]], -1), vip, mask)
    wide = nn.TransformerEncoderLayer(2 * D, HEADS, batch_first=True, norm_first=True)
    narrow = nn.TransformerEncoderLayer(D, HEADS, batch_first=True, norm_first=True)
    with pytest.raises(
        ValueError, match=rf"share one width .*layers\[0\]: {D}, local_layers\[0\]: {2 * D}"
    ):
        VCCEncoder([narrow], local_layers=[wide])


def test_a_sequence_without_vip_tokens_refines_its_earliest_blocks():
    """No VIP token: every candidate scores 0 and the stable top-k refines the ``h``
    earliest blocks; the later blocks' tokens share one update each."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(1, 24, D, generator=gen, dtype=torch.float64)
    no_vip = torch.zeros(1, 24, dtype=torch.bool)
    update = (_encoder(1, block_size=4, num_refined=2)(x, no_vip) - x)[0].view(6, 4, D)
    spread = (update - update.mean(1, keepdim=True)).abs().amax((1, 2))
    assert (spread[:2] > 1e-3).all() and (spread[2:] < 1e-12).all()
    refined_all = _encoder(1, block_size=4, num_refined=6)(x, no_vip)
    torch.testing.assert_close(
        refined_all, _full(_encoder(1).layers, x, ~no_vip), rtol=0, atol=1e-12
    )
