r"""The leaf level of equal-fanout HSA read in the inputs' own ``[L, H, d]`` memory.

:mod:`hiergraph.ops.hsa.uniform` works heads first (:mod:`~hiergraph.ops.hsa.heads_first`):
a level's families are ``[H, F, b, ·]``, so that one batched matrix product covers every
head and family. Inputs held node-major (``[L, H, d]`` contiguous, the layout of a
``Linear`` projection) would first be copied to that layout, and the output and every leaf
gradient copied back. At the leaf level the copies can be skipped: seen as
``[F, b, H, d]``, one head's families are a batch of ``[b, d]`` matrices with row stride
``H d``, which CPU BLAS reads in place as fast as contiguous ones. So the leaf level runs
one product per head on these strided views:

* :func:`token_scores`: the logits ``[H, F, b, b]`` and the family sums of ``q`` and ``k``
  (heads first, for the level above);
* :func:`token_product`: ``base + p @ v`` written straight into node-major ``[F, b, H,
  d_v]`` memory (the output's layout), with the output gradient read in place;
* :func:`token_sum`: the family sums (weighted, under a leaf mask) of the values, heads
  first, for the level above.

Results that are heads first (the logits and their gradient) are written head by head into
one buffer; node-major ones (the output, the leaves' gradients) are stacked once, which
costs what the copy of the product's result would. What is saved are the copies of ``q``,
``k``, ``v`` and of the output gradient.
Both are differentiable twice (their backwards are made of the same differentiable
products).
"""

from __future__ import annotations

import torch
from torch import Tensor

from hiergraph._autograd import AutogradFunction
from hiergraph.ops.hsa.family_products import family_product

#: Most heads read node-major when gradients are taken: per-head products over rows ``H d``
#: apart lose to one copy and one batched product from about 12 heads (32 × 512 tokens,
#: 12 heads × 64: 7% slower forward+backward; 4 and 8 heads: 4–8% faster).
MAX_HEADS = 8

#: Most heads read node-major without gradients (inference), where the copies are a larger
#: share of the time: forward alone, 12–32 heads × 32–64 over 4K tokens in trees of
#: families of 4–16, node-major is 1.07–1.5× faster (one shape of families of 4 at
#: 12 heads, 0.92–0.96×).
MAX_HEADS_INFERENCE = 32

#: Largest ``q`` (elements) read node-major when gradients are taken: past it the per-head
#: passes over memory lose to the copies (4 heads × 64: 10% slower forward+backward at 64K
#: and 256K leaves, 5–8% faster up to 16K). Without gradients there is no limit: forward
#: alone, node-major is 1.2× faster at 6.3M elements (64 × 256 tokens, 12 heads × 32) and
#: 1.9× at 67M (256K leaves, 4 heads × 64), 2 threads, freed memory reused.
MAX_ELEMENTS = 1 << 22


def fits(q: Tensor, b: int, grad: bool = True, pairs: bool = False) -> bool:
    """Whether a leaf level of families of ``b`` runs on ``q``'s node-major memory: a
    contiguous ``[L, H, d]`` CPU tensor with ``b >= 3`` (``pairs``: or ``b = 2``, which the
    forward-only passes read in place with :func:`pair_gram`, :func:`pair_sum` and
    :func:`pair_products`;
    the recorded op's element-wise passes over families of two take them heads first) and,
    when a ``grad`` is taken, at most :data:`MAX_ELEMENTS` elements and ``2 <= H <=``
    :data:`MAX_HEADS`; without, ``2 <= H <=`` :data:`MAX_HEADS_INFERENCE`."""
    heads = q.size(1)
    return (
        q.device.type == "cpu"
        and q.is_contiguous()
        and (q.numel() <= MAX_ELEMENTS or not grad)
        and 1 < heads <= (MAX_HEADS if grad else MAX_HEADS_INFERENCE)
        and (b >= 3 or pairs and b == 2)
    )


def token_families(x: Tensor, b: int) -> Tensor:
    """Node-major rows ``[L, H, c]`` viewed as families ``[F, b, H, c]``."""
    return x.unflatten(0, (-1, b))


def token_sum(x: Tensor, dtype: torch.dtype, weight: Tensor | None = None) -> Tensor:
    r"""The family sums ``[H, F, c]`` (heads first, contiguous) of ``x [F, b, H, c]``,
    taken in ``dtype``; with ``weight [F, b]``, the weighted sums
    :math:`\sum_i w_i x_i` (one batched product ``[F, 1, b] @ [F, b, H c]``, which reads
    ``x`` in place: no weighted copy)."""
    if weight is None:
        sums = x.sum(1, dtype=dtype)
    else:
        sums = _WeightedSum.apply(x, weight, dtype)
    return sums.transpose(0, 1).contiguous()


def pair_gram(x: Tensor, y: Tensor, alpha: float) -> Tensor:
    r""":func:`head_gram` of node-major families of two ``x, y [F, 2, H, c]``: the logits
    :math:`\alpha\, x_i^\top y_j` ``[H, F, 2, 2]`` (contiguous) as one broadcast product
    summed over ``c`` (0.8× the time of a ``[2, c] @ [c, 2]`` product per family and head).
    No autograd (the forward-only passes)."""
    return (x.unsqueeze(2) * y.unsqueeze(1)).sum(-1).mul_(alpha).permute(3, 0, 1, 2).contiguous()


def pair_sum(x: Tensor, dtype: torch.dtype, weight: Tensor | None = None) -> Tensor:
    r""":func:`token_sum` of families of two, ``x [F, 2, H, c]``: one add
    (:math:`w_0 x_0 + w_1 x_1` with ``weight [F, 2]``: a multiply and a multiply-add) written
    straight into heads-first ``[H, F, c]`` memory, where a reduction over the inner
    dimension of size 2 takes 2–3× longer. No autograd (the forward-only passes)."""
    out = x.new_empty(x.size(2), x.size(0), x.size(3), dtype=dtype)
    rows, first, second = out.transpose(0, 1), x[:, 0].to(dtype), x[:, 1].to(dtype)
    if weight is None:
        torch.add(first, second, out=rows)
    else:
        weight = weight.to(dtype)[:, :, None, None]
        torch.mul(first, weight[:, 0], out=rows).addcmul_(second, weight[:, 1])
    return out


def pair_products(p: Tensor, x: Tensor, base: Tensor | None) -> Tensor:
    r"""``base + p_h x_h`` for every head ``h`` of heads-first weights ``p [H, F, m, 2]``,
    node-major families of two ``x [F, 2, H, c]`` and ``base [H, F, 1, c]`` (``None``: 0),
    written node-major ``[F, m, H, c]``: two broadcast multiply-adds over all heads at once
    (:math:`\mathrm{base} + p_{:,0} x_0 + p_{:,1} x_1`). No autograd (the forward-only
    passes)."""
    weights = p.permute(1, 2, 3, 0).unsqueeze(-1)  # [F, m, 2, H, 1]
    out = x.new_empty(x.size(0), p.size(2), *x.shape[2:])
    if base is None:
        torch.mul(weights[:, :, 0], x[:, :1], out=out)
    else:
        torch.addcmul(base.permute(1, 2, 0, 3), weights[:, :, 0], x[:, :1], out=out)
    return out.addcmul_(weights[:, :, 1], x[:, 1:])


class _WeightedSum(AutogradFunction):
    """``sum_i w_i x_i`` ``[F, H, c]`` over the ``b`` rows of ``x [F, b, H, c]`` (weights
    ``[F, b]``, no gradient) in ``dtype``. Autograd's own backward of the batched product
    is an outer product with inner size 1 (one BLAS call per family, 2–3× the forward's
    time); here it is one broadcast product, written in ``x``'s layout."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, dtype: torch.dtype) -> Tensor:
        ctx.save_for_backward(weight)
        ctx.dtype = x.dtype
        rows = x.flatten(2).to(dtype)
        return torch.bmm(weight.to(dtype).unsqueeze(1), rows).view(x.size(0), *x.shape[2:])

    @staticmethod
    def backward(ctx, grad: Tensor):
        (weight,) = ctx.saved_tensors
        grad_x = grad.unsqueeze(1) * weight[:, :, None, None].to(grad.dtype)
        return grad_x.to(ctx.dtype), None, None


def token_scores(q: Tensor, k: Tensor, tau: float, sums_dtype: torch.dtype | None = None):
    r"""The logits :math:`\tau\, q k^\top` ``[H, F, b, b]`` of the families ``q, k [F, b,
    H, d]`` and, with ``sums_dtype``, the family sums ``[H, F, d]`` of ``q`` and ``k`` in
    that dtype; a tuple either way (as :func:`~hiergraph.ops.hsa.uniform.scores`). The
    gradients of the sums are the base of the products that give ``q``'s and ``k``'s."""
    return _TokenScores.apply(q, k, tau, sums_dtype)


def token_product(p: Tensor, v: Tensor, base: Tensor | None) -> Tensor:
    """``base + p @ v`` for weights ``p [H, F, b, b]``, values ``v [F, b, H, d_v]`` and an
    optional ``base [H, F, 1, d_v]`` (broadcast over the rows): ``[F, b, H, d_v]``."""
    return _TokenProduct.apply(p, v, base)


def per_head(fn, heads: int, dim: int) -> Tensor:
    """``fn(h)`` for every head, stacked along ``dim``."""
    return torch.stack([fn(h) for h in range(heads)], dim)


def head_gram(x: Tensor, y: Tensor, alpha: float | None = None) -> Tensor:
    """``alpha * x_h @ y_h^T`` for every head ``h`` of node-major ``x [F, b, H, c]`` and
    ``y [F, b', H, c]``: heads first, ``[H, F, b, b']``. Written head by head into one
    buffer (``baddbmm_`` with ``beta=0``: no stacking copy and no scaling pass), unless
    autograd records it (the backward of a double backward): then stacked, differentiable.
    ``alpha`` as in :func:`~hiergraph.ops.hsa.family_products.family_gram`."""
    heads = x.size(2)
    if torch.is_grad_enabled():
        out = per_head(lambda h: x[:, :, h] @ y[:, :, h].transpose(1, 2), heads, 0)
        return out if alpha is None else out * alpha
    out = x.new_empty(heads, x.size(0), x.size(1), y.size(1))
    for h in range(heads):
        out[h].baddbmm_(
            x[:, :, h], y[:, :, h].transpose(1, 2), beta=0, alpha=1 if alpha is None else alpha
        )
    return out


def head_rows(base: Tensor | None, h: int, rows: int) -> Tensor | None:
    """Head ``h`` of a ``[H, F, 1, c]`` base, broadcast to ``[F, rows, c]`` (a view)."""
    return None if base is None else base[h].expand(-1, rows, -1)


class _TokenScores(AutogradFunction):
    @staticmethod
    def forward(ctx, q, k, tau, sums_dtype):
        ctx.save_for_backward(q, k)
        ctx.tau = tau
        ctx.set_materialize_grads(False)
        logits = head_gram(q, k, tau)
        if sums_dtype is None:
            return (logits,)
        return logits, token_sum(q, sums_dtype), token_sum(k, sums_dtype)

    @staticmethod
    def backward(ctx, grad, *sum_grads):
        q, k = ctx.saved_tensors
        bases = [None if g is None else g.to(q.dtype).unsqueeze(2) for g in sum_grads]
        bases += [None] * (2 - len(bases))
        rows, heads = q.shape[1:3]
        if grad is None:  # only the sums were used: their gradients, broadcast
            grads = [None if g is None else g.permute(1, 2, 0, 3).expand_as(q) for g in bases]
            return *grads, None, None
        grad = grad * ctx.tau
        grad_q = per_head(
            lambda h: family_product(grad[h], k[:, :, h], head_rows(bases[0], h, rows)), heads, 2
        )
        grad_k = per_head(
            lambda h: family_product(grad[h].mT, q[:, :, h], head_rows(bases[1], h, rows)), heads, 2
        )
        return grad_q, grad_k, None, None


class _TokenProduct(AutogradFunction):
    @staticmethod
    def forward(ctx, p, v, base):
        ctx.save_for_backward(p, v)
        ctx.has_base = base is not None
        rows = v.size(1)
        return per_head(
            lambda h: family_product(p[h], v[:, :, h], head_rows(base, h, rows)), v.size(2), 2
        )

    @staticmethod
    def backward(ctx, grad):
        p, v = ctx.saved_tensors
        if 0 in grad.stride():  # a broadcast gradient: bmm would run it matrix by matrix
            grad = grad.contiguous()
        heads = v.size(2)
        grad_p = head_gram(grad, v)
        grad_v = per_head(lambda h: p[h].transpose(1, 2) @ grad[:, :, h], heads, 2)
        grad_base = grad.sum(1).transpose(0, 1).unsqueeze(2) if ctx.has_base else None
        return grad_p, grad_v, grad_base
