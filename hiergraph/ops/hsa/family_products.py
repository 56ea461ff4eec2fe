r"""Batched products over families: the linear algebra of sibling attention.

A level's families are batches of ``b`` member rows, ``[..., b, c]`` (heads and families
in the leading dimensions). Sibling attention and its gradients are made of a few products
over them, here each in its fastest form for the shape at hand and differentiable twice:

* :func:`family_gram`: :math:`\alpha\, x y^\top` ``[..., b, b]`` (the logits
  :math:`\tau\, q k^\top`, the weights' gradient :math:`dO\, v^\top`); on the CPU,
  families of four several at a time;
* :func:`family_product`: :math:`\mathrm{base} + \alpha\, p v` ``[..., m, d]`` for
  weights ``p [..., m, b]`` and rows ``v [..., b, d]`` (:math:`\vartheta = p v`, the
  gradients of ``q, k, v``); on the CPU, families of two as two multiply-adds
  (:func:`pair_product`);
* :func:`summed_products`: :math:`\sum_t p_t v_t` over one set of rows grouped into
  families of a different size per term, accumulated in place;
* :func:`family_sum`: the sum ``[..., c]`` of the ``b`` members (a parent's pooled rows);
* :func:`family_diagonal` and :func:`fill_diagonal`: the diagonal of ``[..., b, b]``
  (the self logits), in forms ``torch.compile`` differentiates correctly.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hiergraph._autograd import AutogradFunction, records_grad


def family_product(
    p: Tensor, v: Tensor, base: Tensor | None = None, *, alpha: float | None = None
) -> Tensor:
    r"""``base + alpha * p @ v`` for weights ``p [..., m, b]`` over a family of ``b`` rows
    ``v [..., b, d]`` and an optional ``base`` broadcastable to ``[..., m, d]`` (``None``:
    the product alone), differentiable twice; ``alpha`` as in :func:`family_gram`.

    A base is the product's own accumulation (``baddbmm``), not a pass of its own over the
    ``[..., m, d]`` result. Families of two on the CPU run as two broadcast multiply-adds
    :math:`\mathrm{base} + p_{:,0} v_0 + p_{:,1} v_1` (:func:`pair_product`, one autograd
    node where autograd records it; ``alpha`` scales the ``[m, 2]`` weights): CPU BLAS
    takes 3–5× longer over a batch of ``[2, 2] @ [2, d]`` products (inner size 2) than over
    the same data as element-wise passes; from ``b = 3`` up, and on accelerators, this is
    ``matmul`` / ``baddbmm`` (one batch of families ``[N, m, b]`` without reshapes)."""
    if type(alpha) in (int, float) and alpha == 1:  # no pass that scales by 1 (a leaf's 1 / n)
        alpha = None
    if p.size(-1) == 2 and p.device.type == "cpu":
        p = p if alpha is None else alpha * p
        return (_PairProduct.apply if records_grad(p, v, base) else pair_product)(p, v, base)
    if base is None:
        out = _matmul(p, v)
        return out if alpha is None else out.mul_(alpha)
    alpha = 1 if alpha is None else alpha
    if p.dim() == 3:  # one batch: baddbmm broadcasts the base itself
        return torch.baddbmm(base, p, v, alpha=alpha)
    *lead, m, b = p.shape
    batch, d = math.prod(lead), v.size(-1)
    base = base.expand(*lead, m, d).reshape(batch, m, d)  # a view where base broadcasts rows
    out = torch.baddbmm(base, p.reshape(batch, m, b), v.reshape(batch, b, d), alpha=alpha)
    return out.view(*lead, m, d)


#: Families of 4 on the CPU that :func:`family_gram` takes several at a time: from this
#: many on, with at most :data:`GRAM_MAX_CHANNELS` channels.
GRAM_MIN_FAMILIES = 1024
GRAM_MAX_CHANNELS = 64


def family_gram(x: Tensor, y: Tensor, alpha: float | None = None) -> Tensor:
    r"""``alpha * x @ y^T`` ``[..., b, b]`` for families ``x, y [..., b, c]`` with the same
    leading dimensions (the logits of a family, or the gradient of its weights),
    differentiable twice. ``alpha=None`` stands for 1: a float default would be traced by
    ``torch.compile(dynamic=True)`` as a symbolic input, which an autograd function's
    backward that first reads it cannot capture (PyTorch 2.13).

    On the CPU a batch of ``[b, c] @ [c, b]`` products with ``b^2 c >= 400`` runs one BLAS
    call per matrix, and for ``b = 4`` that call costs more than its arithmetic: there
    (``c <= 64``, from :data:`GRAM_MIN_FAMILIES` families on) the families are taken four
    at a time, as one ``[16, c] @ [c, 16]`` product whose diagonal ``[4, 4]`` blocks are
    theirs: four times the arithmetic, in 0.6–0.75× the time (6,144 families of 4 × 32
    or 4,096 of 4 × 64, 2 threads). Smaller products run in one loop, larger ones pay off
    their call: any other case is one batched product (``bmm`` where ``x`` and ``y`` have the
    same leading dimensions: :func:`_matmul`), and so is every case traced by
    ``torch.compile`` (the blocks are a diagonal view: see :func:`family_diagonal`)."""
    *lead, b, c = x.shape
    families = math.prod(lead)
    blocked = (
        x.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and b == 4
        and c <= GRAM_MAX_CHANNELS
        and families >= GRAM_MIN_FAMILIES
        and families % 4 == 0
        and y.shape == x.shape
    )
    if blocked:
        rows = (-1, 4 * b, c)
        full = torch.bmm(x.reshape(rows), y.reshape(rows).transpose(1, 2))
        blocks = full.view(-1, 4, b, 4, b).diagonal(dim1=1, dim2=3)  # [groups, b, b, 4]
        out = blocks.movedim(-1, 1).reshape(*lead, b, b)
    else:
        out = _matmul(x, y.transpose(-1, -2))
    return out if alpha is None else out.mul_(alpha)


def _matmul(x: Tensor, y: Tensor) -> Tensor:
    """``x @ y`` for ``x [..., m, k]`` and ``y [..., k, n]``: where their leading
    dimensions are the same (one batch of families, no broadcasting), one ``bmm`` over them
    (five dispatched operations where ``matmul`` takes seven, two for three-dimensional
    ones); else ``torch.matmul``."""
    if x.dim() < 3 or x.shape[:-2] != y.shape[:-2]:
        return torch.matmul(x, y)
    if x.dim() == 3:
        return torch.bmm(x, y)
    return torch.bmm(x.flatten(0, -3), y.flatten(0, -3)).view(*x.shape[:-1], y.size(-1))


def family_diagonal(x: Tensor) -> Tensor:
    r"""The diagonal ``[..., b]`` of ``x [..., b, b]``: a view, or, traced by
    ``torch.compile``, the sum of ``x`` masked to its diagonal (the same values: one term
    and zeros).

    The gradient of a diagonal view is a scatter into a buffer of zeros, which inductor
    (PyTorch 2.13) lowers as a write into that buffer, and it can fuse a read of the buffer
    into the same kernel ahead of the write: the gradient then misses the diagonal's share
    (wrong ``q, k`` gradients of the strictly causal op, silently). The masked sum's
    gradient is element-wise."""
    if torch.compiler.is_compiling():
        return torch.where(_diagonal_mask(x), x, 0).sum(-1)
    return x.diagonal(dim1=-2, dim2=-1)


def fill_diagonal(x: Tensor, value: float) -> Tensor:
    r"""``x [..., b, b]`` with ``value`` on its diagonal: written in place, or, traced by
    ``torch.compile``, a masked copy (a write into a diagonal view is the scatter that
    :func:`family_diagonal` avoids)."""
    if torch.compiler.is_compiling():
        return x.masked_fill(_diagonal_mask(x), value)
    x.diagonal(dim1=-2, dim2=-1).fill_(value)
    return x


def _diagonal_mask(x: Tensor) -> Tensor:
    """``[b, b]``, true on the diagonal of the last two dimensions of ``x``."""
    return torch.eye(x.size(-1), dtype=torch.bool, device=x.device)


def summed_products(pairs: list[tuple[Tensor, Tensor]]) -> Tensor:
    r""":math:`\sum_t p_t v_t` over one set of ``L`` rows grouped into families of a
    different size per term: weights ``p_t [H, F_t, m_t, b_t]`` (``F_t m_t = L``) and
    values ``v_t [H, F_t, b_t, d]``; ``[H, L, d]``, differentiable twice.

    The terms accumulate in place into the first one's result (``baddbmm_``; families of
    two on the CPU, two ``addcmul_``), where a chain of :func:`family_product` calls with
    bases would copy the ``[H, L, d]`` sum once per term."""
    return _SummedProducts.apply(*(t for pair in pairs for t in pair))


def _accumulate(out: Tensor, p: Tensor, v: Tensor) -> None:
    """``out += p @ v`` in place (``out`` ``[..., m, d]`` contiguous, ``p [..., m, b]``)."""
    if p.size(-1) == 2 and p.device.type == "cpu":  # see family_product
        out.addcmul_(*pair_member(p, v, 0)).addcmul_(*pair_member(p, v, 1))
        return
    *lead, m, b = p.shape
    batch = math.prod(lead)
    out.view(batch, m, -1).baddbmm_(p.reshape(batch, m, b), v.reshape(batch, b, -1))


class _SummedProducts(AutogradFunction):
    """:func:`summed_products` of the flattened pairs ``p_0, v_0, p_1, v_1, …``; term
    ``t``'s gradients are ``G_t v_t^T`` and ``p_t^T G_t`` (``G_t``: the output gradient,
    made contiguous once, in the term's family layout)."""

    @staticmethod
    def forward(ctx, *pairs: Tensor) -> Tensor:
        ctx.save_for_backward(*pairs)
        out = None
        for p, v in zip(pairs[::2], pairs[1::2], strict=True):
            if out is None:
                out = family_product(p, v).contiguous()
            else:
                _accumulate(out.view(*p.shape[:-1], -1), p, v)
        return out.flatten(1, 2)

    @staticmethod
    def backward(ctx, grad: Tensor):
        pairs = ctx.saved_tensors
        grad = grad.contiguous()  # once, not in every term's batched products
        grads = []
        for p, v in zip(pairs[::2], pairs[1::2], strict=True):
            g = grad.unflatten(1, (-1, p.size(-2)))
            grads += [family_gram(g, v), family_product(p.transpose(-1, -2), g)]
        return tuple(grads)


def family_sum(x: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    r"""The sum ``[..., c]`` of the ``b`` members of ``x [..., b, c]`` (taken in ``dtype``,
    default ``x``'s), differentiable twice.

    Families of two on the CPU are one element-wise add of the two members: a reduction
    over an inner dimension of size 2 takes 2–3× longer there."""
    if x.size(-2) == 2 and x.device.type == "cpu":
        return _PairSum.apply(x, dtype or x.dtype)
    return x.sum(-2, dtype=dtype)


class _PairSum(AutogradFunction):
    """``x[..., 0, :] + x[..., 1, :]`` in ``dtype``; the gradient of both members is the
    output's, broadcast (a view)."""

    @staticmethod
    def forward(ctx, x: Tensor, dtype: torch.dtype) -> Tensor:
        ctx.dtype = x.dtype
        return torch.add(x[..., 0, :].to(dtype), x[..., 1, :].to(dtype))

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad.to(ctx.dtype).unsqueeze(-2).expand(*grad.shape[:-1], 2, grad.size(-1)), None


def pair_member(p: Tensor, v: Tensor, i: int) -> tuple[Tensor, Tensor]:
    r"""The weights ``[..., m, 1]`` in ``p [..., m, 2]`` of member ``i`` of a family of two
    and that member's row ``[..., 1, d]`` of ``v [..., 2, d]`` (views)."""
    return p[..., i : i + 1], v[..., i : i + 1, :]


def pair_product(p: Tensor, v: Tensor, base: Tensor | None) -> Tensor:
    r"""``base + p @ v`` for families of two (``p [..., m, 2]``, ``v [..., 2, d]``,
    ``base`` optional, broadcastable to ``[..., m, d]``): two broadcast multiply-adds
    :math:`p_{:,0} v_0 + p_{:,1} v_1`, the second in place."""
    p0, v0 = pair_member(p, v, 0)
    first = p0 * v0 if base is None else base.addcmul(p0, v0)
    # first is a new tensor of the product's shape (a base broadcasts to it): add in place
    return first.addcmul_(*pair_member(p, v, 1))


class _PairProduct(AutogradFunction):
    """``base + p @ v`` over families of two (``base`` optional, broadcastable to the
    product); autograd's own backward of the two multiply-adds reduces over ``d`` twice, so
    ``p``'s gradient is ``G v^T`` (inner size ``d``), ``v``'s the same pair product with
    ``p^T`` and ``base``'s ``G`` summed to its shape."""

    @staticmethod
    def forward(ctx, p: Tensor, v: Tensor, base: Tensor | None) -> Tensor:
        ctx.save_for_backward(p, v)
        ctx.base_shape = None if base is None else base.shape
        return pair_product(p, v, base)

    @staticmethod
    def backward(ctx, grad: Tensor):
        p, v = ctx.saved_tensors
        grad_base = None
        if ctx.base_shape is not None:  # a base broadcast over the rows: their sum
            rows = family_sum(grad).unsqueeze(-2) if ctx.base_shape[-2] == 1 else grad
            grad_base = rows.sum_to_size(ctx.base_shape)
        return (
            torch.matmul(grad, v.transpose(-1, -2)),
            family_product(p.transpose(-1, -2), grad),
            grad_base,
        )
