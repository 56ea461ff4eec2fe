"""The node-major leaf level of equal-fanout HSA: per-head products on strided views equal
the plain expressions, with first and second derivatives."""

import pytest
import torch

from hiergraph.ops.hsa import token_layout

F64 = dict(dtype=torch.float64)


def _families(*shape, seed):
    """Node-major rows ``[F * b, H, c]`` viewed as ``[F, b, H, c]`` (strided per head)."""
    gen = torch.Generator().manual_seed(seed)
    f, b, h, c = shape
    x = torch.randn(f * b, h, c, generator=gen, **F64)
    return token_layout.token_families(x, b).detach().requires_grad_()


@pytest.mark.parametrize("used", ["all", "logits", "sums"])
def test_scores_and_sums_equal_the_plain_expressions_differentiable_twice(used):
    q, k = _families(2, 3, 2, 4, seed=0), _families(2, 3, 2, 4, seed=1)
    logits, sum_q, sum_k = token_layout.token_scores(q, k, 0.7, torch.float64)
    heads_first = [t.permute(2, 0, 1, 3) for t in (q, k)]  # [H, F, b, c]
    torch.testing.assert_close(logits, 0.7 * heads_first[0] @ heads_first[1].mT, atol=1e-15, rtol=0)
    torch.testing.assert_close(sum_q, heads_first[0].sum(2), atol=1e-15, rtol=0)
    torch.testing.assert_close(sum_k, heads_first[1].sum(2), atol=1e-15, rtol=0)
    assert sum_q.is_contiguous() and sum_k.is_contiguous()
    gen = torch.Generator().manual_seed(2)
    weights = [torch.randn(t.shape, generator=gen, **F64) for t in (logits, sum_q, sum_k)]

    def fn(q, k):
        outs = token_layout.token_scores(q, k, 0.7, torch.float64)
        pick = {"all": (0, 1, 2), "logits": (0,), "sums": (1, 2)}[used]
        return sum((outs[i] * weights[i]).sum() for i in pick)

    assert torch.autograd.gradcheck(fn, (q, k))
    assert torch.autograd.gradgradcheck(fn, (q, k))


@pytest.mark.parametrize("with_base", [False, True])
def test_product_is_written_node_major_differentiable_twice(with_base):
    gen = torch.Generator().manual_seed(3)
    p = torch.rand(2, 2, 3, 3, generator=gen, **F64).requires_grad_()  # [H, F, b, b]
    v = _families(2, 3, 2, 5, seed=4)
    inputs = [p, v]
    if with_base:
        inputs.append(torch.randn(2, 2, 1, 5, generator=gen, **F64).requires_grad_())
    out = token_layout.token_product(*inputs, *([] if with_base else [None]))
    want = p @ v.permute(2, 0, 1, 3) + (inputs[2] if with_base else 0)  # [H, F, b, c]
    torch.testing.assert_close(out, want.permute(1, 2, 0, 3), atol=1e-15, rtol=0)
    assert out.is_contiguous()  # [F, b, H, c]: the rows' own memory layout

    def fn(*args):
        return token_layout.token_product(*args, *([] if with_base else [None]))

    assert torch.autograd.gradcheck(fn, tuple(inputs))
    assert torch.autograd.gradgradcheck(fn, tuple(inputs))


@pytest.mark.parametrize("weighted", [False, True])
def test_sums_heads_first_weighted_differentiable_twice(weighted):
    x = _families(3, 4, 2, 5, seed=5)
    weight = (torch.arange(12).view(3, 4) % 3 != 0).double() if weighted else None
    out = token_layout.token_sum(x, torch.float64, weight)
    w = torch.ones(3, 4, **F64) if weight is None else weight
    want = (x * w[:, :, None, None]).sum(1).transpose(0, 1)  # [H, F, c]
    torch.testing.assert_close(out, want, atol=1e-15, rtol=0)
    assert out.is_contiguous()

    def fn(x):
        return token_layout.token_sum(x, torch.float64, weight)

    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))


def test_a_broadcast_output_gradient_is_made_dense():
    p = torch.rand(2, 2, 3, 3, **F64).requires_grad_()
    v = _families(2, 3, 2, 5, seed=5)
    out = token_layout.token_product(p, v, None)
    from_sum = torch.autograd.grad(out.sum(), (p, v))  # one value, stride 0
    from_ones = torch.autograd.grad(
        token_layout.token_product(p, v, None), (p, v), torch.ones_like(out)
    )
    for a, b in zip(from_sum, from_ones, strict=True):
        assert torch.equal(a, b)


def test_fits_node_major_cpu_rows_of_several_heads_and_families_of_three_or_more():
    x = torch.randn(12, 2, 4)
    assert token_layout.fits(x, 3)
    assert not token_layout.fits(x, 2)  # pairs: element-wise passes
    assert not token_layout.fits(torch.randn(12, 1, 4), 3)  # one head: heads first already
    more = torch.randn(12, token_layout.MAX_HEADS + 1, 4)
    assert not token_layout.fits(more, 3) and token_layout.fits(more, 3, grad=False)
    assert not token_layout.fits(torch.randn(12, token_layout.MAX_HEADS_INFERENCE + 1, 4), 3, False)
    big = torch.empty(token_layout.MAX_ELEMENTS // 8 + 1, 2, 4)
    assert not token_layout.fits(big, 3) and token_layout.fits(big, 3, grad=False)
    assert not token_layout.fits(x.transpose(0, 1).contiguous().transpose(0, 1), 3)
