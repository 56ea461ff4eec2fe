"""Families in PyTorch's fused CPU attention kernel (:mod:`hiergraph.ops.hsa.family_fused`):
the leaf families of the fused kernel equal the masked softmax."""

import math

import pytest
import torch

from hiergraph.ops.hsa import family, family_fused
from hiergraph.ops.hsa.family_products import family_gram
from hiergraph.ops.logspace import masked_softmax

F64 = dict(dtype=torch.float64)


@pytest.mark.parametrize("left_only", [False, True], ids=["siblings", "left-siblings"])
@pytest.mark.parametrize("eps", ["none", "per-head", "shared"])
def test_leaf_family_attention_equals_the_masked_softmax(left_only, eps):
    """The fused kernel's leaf families: ``lse`` and ``theta`` equal the masked softmax's,
    with their gradients (float64); a first leaf without left siblings gets ``-inf`` and
    0; second derivatives pass ``gradgradcheck``."""
    gen = torch.Generator().manual_seed(7)
    q, k = (torch.randn(3, 4, 6, 5, generator=gen, **F64) for _ in range(2))
    v = torch.randn(3, 4, 6, 2, generator=gen, **F64)
    e = {"none": None, "per-head": torch.randn(3, 4, 6, 2, generator=gen, **F64),
         "shared": torch.randn(1, 4, 6, 2, generator=gen, **F64)}[eps]  # fmt: skip
    inputs = [t.requires_grad_() for t in (q, k, v) + (() if e is None else (e,))]

    def reference(q, k, v, *e):
        logits = family_gram(q, k, 0.7) + (family_gram(*e, *e) if e else 0)
        lse, p = masked_softmax(logits, ~family.left_out(6, left_only, q.device))
        return lse, p @ v

    def fused(q, k, v, *e):
        return family_fused.leaf_family_attention(q, k, v, e[0] if e else None, 0.7, left_only)

    (lse, theta), (ref_lse, ref_theta) = fused(*inputs), reference(*inputs)
    torch.testing.assert_close(lse, ref_lse, atol=1e-12, rtol=0)
    torch.testing.assert_close(theta, ref_theta, atol=1e-12, rtol=0)
    if left_only:
        assert (lse[..., 0] == -math.inf).all() and (theta[..., 0, :] == 0).all()
    finite = torch.isfinite(ref_lse)
    upstream = torch.randn_like(lse), torch.randn_like(theta)

    def loss(lse, theta):
        return (torch.where(finite, lse, 0) * upstream[0]).sum() + (theta * upstream[1]).sum()

    grads = torch.autograd.grad(loss(lse, theta), inputs)
    for g, g_ref in zip(grads, torch.autograd.grad(loss(ref_lse, ref_theta), inputs), strict=True):
        torch.testing.assert_close(g, g_ref, atol=1e-12, rtol=0)
    small = [t[:1, :1, :4].detach().requires_grad_() for t in inputs]
    assert torch.autograd.gradgradcheck(lambda *x: fused(*x)[1], small)
