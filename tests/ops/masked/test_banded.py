"""Blocked banded attention against its dense O(N^2) reference."""

import pytest
import torch

from hiergraph.ops.masked import banded
from hiergraph.ops.masked.banded import (
    band_predicate,
    banded_attention,
    banded_attention_reference,
    segment_ids,
)
from tests.conftest import assert_same_gradients, spy_calls

# (n, before, after, lengths, dilation, block_size, chunk_size)
BANDS = [
    (50, 3, 3, None, 1, None, 4096),  # sliding window
    (50, 4, 0, None, 1, 8, 16),  # causal window, several chunks
    (33, 40, 0, None, 1, 8, 8),  # causal (window wider than the sequence)
    (33, 40, 40, None, 1, None, 4096),  # full
    (47, 5, 2, [20, 0, 27], 1, 8, 16),  # asymmetric band over segments (one empty)
    (40, 9, 9, [10, 10, 10, 10], 1, 16, 32),  # block diagonal
    (37, 2, 2, None, 3, 4, 8),  # dilated window
    (61, 2, 0, [30, 31], 4, 8, 16),  # dilated causal window over segments
    (12, 0, 0, None, 1, None, 4096),  # identity
    (5, 1, 1, None, 1, 64, 4096),  # block larger than the sequence
]


def _qkv(n, heads=2, dim=5, dim_v=3, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(n, heads, dim), (n, heads, dim), (n, heads, dim_v)]
    return [torch.randn(s, generator=gen, dtype=dtype, requires_grad=True) for s in shapes]


@pytest.mark.parametrize("n,before,after,lengths,dilation,block,chunk", BANDS)
def test_matches_dense_reference_float64(n, before, after, lengths, dilation, block, chunk):
    q, k, v = _qkv(n)
    out = banded_attention(
        q, k, v, before, after, lengths, dilation, block_size=block, chunk_size=chunk
    )
    ref = banded_attention_reference(q, k, v, before, after, lengths, dilation)
    assert out.shape == (n, 2, 3)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    assert_same_gradients(out, ref, (q, k, v), atol=1e-12, rtol=0)


def test_matches_dense_reference_float32_and_scale():
    q, k, v = _qkv(300, heads=4, dim=16, dim_v=16, dtype=torch.float32)
    out = banded_attention(q, k, v, 20, 20, [100, 200], scale=0.3)
    ref = banded_attention_reference(q, k, v, 20, 20, [100, 200], scale=0.3)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_gradcheck():
    q, k, v = _qkv(11, heads=1, dim=2, dim_v=2)
    assert torch.autograd.gradcheck(
        lambda q, k, v: banded_attention(q, k, v, 2, 1, [6, 5], block_size=4, chunk_size=4),
        (q, k, v),
    )


def test_no_grad_equals_grad_path():
    q, k, v = _qkv(40)
    with torch.no_grad():
        plain = banded_attention(q, k, v, 3, 1, block_size=8, chunk_size=8)
    torch.testing.assert_close(banded_attention(q, k, v, 3, 1, block_size=8, chunk_size=8), plain)


def test_dropout_is_reproducible_and_finite():
    q, k, v = _qkv(64)
    torch.manual_seed(1)
    first = banded_attention(q, k, v, 4, 4, dropout_p=0.5, block_size=8, chunk_size=16)
    (grad_first,) = torch.autograd.grad(first.sum(), q)
    torch.manual_seed(1)
    second = banded_attention(q, k, v, 4, 4, dropout_p=0.5, block_size=8, chunk_size=16)
    (grad_second,) = torch.autograd.grad(second.sum(), q)
    assert torch.isfinite(first).all() and torch.isfinite(grad_first).all()
    torch.testing.assert_close(first, second)
    torch.testing.assert_close(grad_first, grad_second)
    assert not torch.allclose(first, banded_attention(q, k, v, 4, 4))


def test_empty_sequence():
    q, k, v = _qkv(0)
    assert banded_attention(q, k, v, 2, 2).shape == (0, 2, 3)


def test_band_predicate_definition():
    seg = segment_ids([4, 5])
    assert seg.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1]
    i, j = torch.arange(9)[:, None], torch.arange(9)[None, :]
    got = band_predicate(i, j, seg, 2, 1, 2)
    off = i - j
    want = (seg[i] == seg[j]) & (off % 2 == 0) & (off <= 4) & (off >= -2)
    assert torch.equal(got, want)


@pytest.mark.parametrize(
    "shapes,kwargs,message",
    [
        ([(5, 2), (5, 2), (5, 2)], {}, r"\[N, heads, channels\]"),
        ([(5, 2, 3), (6, 2, 3), (6, 2, 3)], {}, "share N and heads"),
        ([(5, 2, 3), (5, 2, 4), (5, 2, 3)], {}, "channel size"),
        ([(5, 2, 3)] * 3, {"before": -1}, "before must be an int >= 0"),
        ([(5, 2, 3)] * 3, {"dilation": 0}, "dilation must be a positive int"),
        ([(5, 2, 3)] * 3, {"lengths": [2, 2]}, "sum to N = 5"),
        ([(5, 2, 3)] * 3, {"block_size": -2}, "block_size must be a positive int"),
        ([(5, 2, 3)] * 3, {"chunk_size": 0}, "chunk_size must be a positive int"),
        ([(5, 2, 3)] * 3, {"dropout_p": -0.5}, r"dropout_p must be a probability in \[0, 1\]"),
        ([(5, 2, 3)] * 3, {"dropout_p": "0.1"}, r"dropout_p must be a probability"),
    ],
)
def test_bad_inputs(shapes, kwargs, message):
    q, k, v = (torch.randn(s) for s in shapes)
    args = {"before": 1, "after": 1} | kwargs
    with pytest.raises(ValueError, match=message):
        banded_attention(q, k, v, **args)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"before": 1.5}, "before must be an int >= 0, got 1.5"),
        ({"dilation": 1.5}, "dilation must be a positive int, got 1.5"),
        ({"lengths": [2.5, 2.5]}, "every segment length must be an int >= 0, got 2.5"),
        ({"block_size": 2.5}, "block_size must be a positive int or None, got 2.5"),
    ],
)
def test_sizes_that_are_not_ints(kwargs, message):
    q = torch.randn(5, 2, 3)
    with pytest.raises(TypeError, match=message):
        banded_attention(q, q, q, **({"before": 1, "after": 1} | kwargs))
    with pytest.raises(TypeError, match="one floating dtype"):
        banded_attention(q.long(), q.long(), q.long(), 1, 1)


def test_dropout_backward_recomputes_the_forward_masks():
    """With its dropout mask fixed the output ``A_drop v`` is linear in ``v``, so
    ``<d(out . w)/dv, v> = out . w`` holds exactly when the backward redraws every
    chunk's mask from the seed its forward used (4 chunks here)."""
    q, k, v = _qkv(64)
    weight = torch.randn(64, 2, 3, generator=torch.Generator().manual_seed(5), dtype=v.dtype)
    torch.manual_seed(3)
    out = banded_attention(q, k, v, 4, 4, dropout_p=0.5, block_size=8, chunk_size=16)
    assert not torch.allclose(out, banded_attention(q, k, v, 4, 4))  # dropout is on
    (grad_v,) = torch.autograd.grad((out * weight).sum(), v)
    torch.testing.assert_close((grad_v * v).sum(), (out * weight).sum(), atol=1e-12, rtol=0)


def test_lengths_may_be_a_tensor():
    """(``lengths or ()`` raised "Boolean value of Tensor ... is ambiguous".)"""
    q, k, v = (torch.randn(5, 2, 3, dtype=torch.float64) for _ in range(3))
    out = banded_attention(q, k, v, 1, 1, torch.tensor([2, 3]))
    torch.testing.assert_close(out, banded_attention(q, k, v, 1, 1, [2, 3]), atol=0, rtol=0)


@pytest.mark.parametrize("device,chunk", [("cpu", 512), ("meta", 16384)])
def test_the_default_chunk_follows_the_device(device, chunk, monkeypatch):
    """By default the CPU takes 512 query rows per chunk (gathered windows that stay in
    cache) and other devices 16,384 (fewer launches; the ``meta`` device, shapes only,
    takes that branch); the op runs there forward and backward in the CPU's shapes."""
    blockings = spy_calls(monkeypatch, banded, "_Blocking")
    q, k, v = (t.detach().to(device).requires_grad_() for t in _qkv(40))
    out = banded_attention(q, k, v, 3, 2, [30, 10])
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert [call["chunk_size"] for call in blockings] == [chunk]
    assert out.shape == (40, 2, 3) and out.device.type == device
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
