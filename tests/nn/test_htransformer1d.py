"""HTransformer1D encoder / language model."""

import math

import pytest
import torch
from torch import nn

from hiergraph.nn.hmatrix_attention import HMatrixAttention
from hiergraph.nn.htransformer1d import HTransformer1D, sinusoidal_positions


def test_language_model_is_causal_and_trains():
    torch.manual_seed(0)
    model = HTransformer1D(20, embed_dim=32, num_layers=2, num_heads=4, block_size=4, causal=True)
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
    model = HTransformer1D(10, embed_dim=16, num_layers=2, num_heads=2, block_size=4, lm_head=False)
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
    for kwargs, match in ((dict(num_layers=-1), "num_layers must be an int >= 0"),  # (no block)
                          (dict(vocab_size=0), "vocab_size must be a positive int"),
                          (dict(ff_mult=0), "ff_mult must be a positive int")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            HTransformer1D(**{"vocab_size": 10, "embed_dim": 8, "num_heads": 2, **kwargs})


def test_sinusoidal_positions():
    pe = sinusoidal_positions(5, 6, dtype=torch.float64)
    assert pe.shape == (5, 6) and pe.dtype == torch.float64
    torch.testing.assert_close(pe[:, 0], torch.sin(torch.arange(5.0)).double())
    torch.testing.assert_close(pe[3, 3], torch.tensor(math.cos(3 * 10000 ** (-2 / 6))).double())
    # float64 is computed in float64: exact far out, where float32 arguments are off by ~1e-3
    far = sinusoidal_positions(20000, 8, dtype=torch.float64)[19999]
    for i in range(4):
        angle = 19999 * 10000 ** (-2 * i / 8)
        assert abs(float(far[2 * i]) - math.sin(angle)) < 1e-9
        assert abs(float(far[2 * i + 1]) - math.cos(angle)) < 1e-9
    # half precision is only the output: positions are not rounded to bfloat16 first
    half = sinusoidal_positions(3000, 8, dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16
    assert torch.equal(half, sinusoidal_positions(3000, 8, dtype=torch.float32).bfloat16())
    assert sinusoidal_positions(4, 8).dtype == torch.get_default_dtype()


def test_attention_factory_swaps_the_attention():
    calls = []

    class Recording(HMatrixAttention):
        def attend(self, q, k, v, key_padding_mask):
            calls.append(q.shape)
            return super().attend(q, k, v, key_padding_mask)

    model = HTransformer1D(7, embed_dim=8, num_layers=3, num_heads=2, attention=Recording)
    assert model(torch.randint(0, 7, (2, 9))).shape == (2, 9, 7)
    assert calls == [(2, 2, 9, 4)] * 3


def test_token_ids_out_of_range_are_refused():
    model = HTransformer1D(7, embed_dim=8, num_layers=1, num_heads=2)
    with pytest.raises(ValueError, match=r"token ids span -1\.\.3; .*vocab_size = 7\)"):
        model(torch.tensor([[0, 3, -1]]))


def test_attention_factory_must_build_causal_modules_for_causal_models():
    with pytest.raises(TypeError, match="causal must be a bool"):  # (a message on the factory)
        HTransformer1D(7, embed_dim=8, num_layers=1, num_heads=2, causal=1)
    with pytest.raises(ValueError, match="causal=True, but the attention factory built"):
        HTransformer1D(7, embed_dim=8, num_layers=1, num_heads=2, causal=True,
                       attention=HMatrixAttention)  # fmt: skip

    def causal(dim, heads):
        return HMatrixAttention(dim, heads, block_size=4, causal=True)

    model = HTransformer1D(7, embed_dim=8, num_layers=1, num_heads=2, causal=True,
                           attention=causal).eval()  # fmt: skip
    tokens = torch.randint(0, 7, (1, 9))
    changed = tokens.clone()
    changed[0, -1] = (tokens[0, -1] + 1) % 7
    assert torch.equal(model(tokens)[:, :-1], model(changed)[:, :-1])


def test_repr_and_reset_parameters():
    model = HTransformer1D(7, embed_dim=8, num_layers=2, num_heads=2, block_size=4, lm_head=False)
    assert repr(model) == "HTransformer1D(7, embed_dim=8, num_layers=2, lm_head=False)"
    assert repr(model.blocks[0]) == (
        "TransformerBlock(HMatrixAttention(8, heads=2, block_size=4, causal=False), 8, ff_mult=4)"
    )
    tokens = torch.randint(0, 7, (1, 9))
    before = model(tokens)
    torch.manual_seed(1)
    model.reset_parameters()
    after = model(tokens)
    assert torch.isfinite(after).all() and not torch.allclose(after, before)


def test_old_argument_names_still_work_with_a_warning():
    torch.manual_seed(0)
    new = HTransformer1D(vocab_size=11, embed_dim=8, num_layers=3, num_heads=2)
    with pytest.warns(FutureWarning) as warned:
        old = HTransformer1D(num_tokens=11, embed_dim=8, depth=3, num_heads=2)
    assert sorted(str(w.message).split(";")[0] for w in warned) == [
        "HTransformer1D(): the argument 'depth' is now called 'num_layers'",
        "HTransformer1D(): the argument 'num_tokens' is now called 'vocab_size'",
    ]
    assert len(old.blocks) == 3 and old.embed.num_embeddings == 11
    assert old.state_dict().keys() == new.state_dict().keys()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        # (True and 2.0 failed inside torch; 0 built a model of width 0)
        (dict(embed_dim=True, num_layers=0), TypeError, "embed_dim must be a positive int"),
        (dict(embed_dim=2.0, num_layers=0), TypeError, "embed_dim must be a positive int"),
        (dict(embed_dim=0, num_layers=0), ValueError, "embed_dim must be a positive int, got 0"),
        # (not checked with an attention factory of the caller's)
        (dict(num_heads=0, attention=lambda d, h: nn.Identity()), ValueError, "num_heads must"),
        (dict(dropout=True), ValueError, r"dropout must be a probability in \[0, 1\]"),
        (dict(dropout="0.1"), ValueError, r"dropout must be a probability"),  # (inside torch)
        (dict(lm_head="no"), TypeError, "lm_head must be a bool, got 'no'"),  # (added the head)
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        HTransformer1D(10, **{"embed_dim": 16, "num_heads": 2, "block_size": 4, **kwargs})


def test_tokens_that_are_no_tensor_are_refused():
    model = HTransformer1D(10, embed_dim=16, num_layers=1, num_heads=2, block_size=4)
    with pytest.raises(TypeError, match="tokens must be an int64 tensor .*, got list"):
        model([[1, 2, 3]])  # (an AttributeError)


def test_reset_parameters_reaches_a_given_attentions_parameters():
    """A factory-built attention without ``reset_parameters`` of its own: its
    ``MultiheadAttention``'s input projection was left as it was."""

    class Flat(nn.Module):
        def __init__(self, dim, heads):
            super().__init__()
            self.mha = nn.MultiheadAttention(dim, heads, batch_first=True)

        def forward(self, x, key_padding_mask):
            return self.mha(x, x, x, key_padding_mask=key_padding_mask, need_weights=False)[0]

    model = HTransformer1D(10, embed_dim=8, num_layers=1, num_heads=2, attention=Flat)
    weight = model.blocks[0].attn.mha.in_proj_weight
    with torch.no_grad():
        weight.fill_(7.0)
    model.reset_parameters()
    assert not (weight == 7.0).any()
