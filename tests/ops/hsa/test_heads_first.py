"""Heads-first storage: the copies to it and back to the inputs' layout, each one pass
forward and backward, and the broadcast gradient made dense."""

import pytest
import torch

from hiergraph.ops.hsa.heads_first import (
    dense_gradient,
    heads_first,
    is_heads_first,
    like,
    transposed,
)
from tests.operators import LargeWrites, Operators


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "heads-first"])
def test_the_heads_first_copy_returns_its_gradient_in_one_pass(layout, dtype):
    """``heads_first`` copies ``[L, H, d]`` rows to a contiguous ``[H, L, d]`` in ``dtype``
    (none when they are heads-first memory already, in that dtype); the gradient comes back
    in the rows' dtype and memory layout in one copy at most, which the leaf keeps as it is
    (accumulating a gradient of another layout would copy it again)."""
    L, H, d = 64, 2, 8
    x = torch.randn(L, H, d, dtype=torch.float64)
    if layout == "heads-first":
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
    x.requires_grad_()
    y = heads_first(x, dtype)
    assert y.is_contiguous() and y.dtype == dtype and y.shape == (H, L, d)
    grad = torch.randn(H, L, d).to(dtype)
    with LargeWrites(L * H * d, only=LargeWrites.COPIES) as copies:
        y.backward(grad)
    no_copy = layout == "heads-first" and dtype == torch.float64
    assert len(copies.names) == (0 if no_copy else 1)
    assert x.grad.dtype == x.dtype and x.grad.stride() == x.stride()
    torch.testing.assert_close(x.grad, grad.transpose(0, 1).double(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [None, torch.float32], ids=["same", "bf16-to-float32"])
def test_transposed_copies_scale_and_cast_in_one_pass(dtype):
    """``transposed`` writes ``(x * scale)^T`` in ``dtype`` (the masked leaves of bf16 inputs
    go heads first in float32 in the same copy), and the gradient comes back transposed,
    scaled and in ``x``'s dtype (differentiable twice)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 2, generator=gen).bfloat16().requires_grad_()
    scale = (torch.arange(5) % 2).float()[:, None, None]
    out = transposed(x, scale, dtype)
    assert out.dtype == (dtype or x.dtype) and out.is_contiguous()
    want = (x.float() * scale).transpose(0, 1).to(out.dtype)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    upstream = torch.randn(out.shape, generator=gen).to(out.dtype).requires_grad_()
    with Operators() as ops:
        (grad,) = torch.autograd.grad((out * upstream).sum(), x, create_graph=True)
    assert grad.dtype == x.dtype and "_to_copy" not in ops.calls  # cast in the copy
    want = (upstream.detach().float().transpose(0, 1) * scale).bfloat16()
    torch.testing.assert_close(grad, want, rtol=0, atol=0)
    (second,) = torch.autograd.grad(grad.float().sum(), upstream)  # through the backward
    assert second.dtype == out.dtype
    torch.testing.assert_close(second, scale.transpose(0, 1).expand(out.shape).to(out.dtype))


def test_dense_gradient_materialises_broadcast_gradients_only():
    x = torch.randn(6, 4, requires_grad=True)
    seen = []
    for backward in (lambda y: y.sum().backward(), lambda y: y.t().backward(torch.ones(4, 6))):
        inner = x * 1.0
        inner.register_hook(lambda g: seen.append(g.stride()))
        backward(dense_gradient(inner))
    assert seen == [(4, 1), (1, 6)]  # stride 0 made dense; a transposed one passed on as is


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "heads-first"])
def test_like_returns_the_output_in_the_memory_layout_and_dtype_of_q(layout, masked):
    """``like`` takes a heads-first output ``[H, L, d]`` back to ``[L, H, d]`` in ``q``'s
    memory layout (read off its strides: ``is_heads_first``) and dtype, its rows scaled by
    the weight if one is given."""
    L, H, d = 6, 2, 3
    q = torch.randn(L, H, d)
    if layout == "heads-first":
        q = q.transpose(0, 1).contiguous().transpose(0, 1)
    assert is_heads_first(q) == (layout == "heads-first")
    out = torch.randn(H, L, d, dtype=torch.float64)
    weight = (torch.arange(L) % 2).double() if masked else None
    got = like(out, q, weight)
    assert got.dtype == q.dtype and got.stride() == q.stride()
    want = out.transpose(0, 1) * (1 if weight is None else weight[:, None, None])
    torch.testing.assert_close(got, want.to(q.dtype), rtol=0, atol=0)
