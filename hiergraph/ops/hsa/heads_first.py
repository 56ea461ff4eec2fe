r"""Heads-first storage for equal-fanout HSA, and the node and family layouts viewed on it.

The ops take their rows node-major, ``[L, H, ·]`` (a ``Linear`` projection's layout). The
passes over equal-fanout forests (:mod:`~hiergraph.ops.hsa.uniform`,
:mod:`~hiergraph.ops.hsa.causal_uniform`, :mod:`~hiergraph.ops.hsa.lifted`) hold them
*heads first*, so that one batched product covers every head and family:

* **heads-first storage**: contiguous ``[H, L, ·]`` memory. Rows ``[L, H, ·]`` that are a
  transposed view of it (:func:`is_heads_first`, read off the strides) are read as they
  are; others are copied once (:func:`heads_first`; :func:`transposed` scales the rows in
  the same copy, e.g. zeroes those of masked leaves), and an output goes back to ``q``'s
  memory layout by :func:`like`. Every copy returns its gradient in one pass too.
* **node layout** ``[H, n_d, ·]``: the ``n_d`` nodes of depth :math:`d` in breadth-first
  order (:func:`per_level` takes every level's rows out of node order, :func:`per_depth`
  heads first).
* **family layout** ``[H, F_d, b_d, ·]``: the same memory viewed with one more dimension
  when each of the ``F_d`` nodes of depth :math:`d - 1` has :math:`b_d` children, whose
  family is then a run of :math:`b_d` consecutive rows (:func:`family_layout` and
  :func:`node_layout` are views, no copies; :func:`tie_leaves` keeps their sizes literal
  under ``torch.compile``).

:func:`dense_gradient` makes a broadcast gradient that reaches these views contiguous. The
leaf level may instead be read in the inputs' own node-major ``[L, H, d]`` memory:
:mod:`~hiergraph.ops.hsa.token_layout`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hiergraph._autograd import AutogradFunction
from hiergraph.ops.rows import permute_rows
from hiergraph.plan.tree_index import TreeIndex


def family_layout(x: Tensor, b: int) -> Tensor:
    """Node layout ``[H, F * b, ...]`` viewed as the family layout ``[H, F, b, ...]``."""
    return x.unflatten(1, (-1, b))


def node_layout(x: Tensor) -> Tensor:
    """Family layout ``[H, F, b, ...]`` viewed as the node layout ``[H, F * b, ...]``."""
    return x.flatten(1, 2)


def tie_leaves(shape: tuple[int, ...], *rows: Tensor | None) -> None:
    r"""Assert that the first dimension of every tensor of ``rows`` (``None``: skipped) is
    the leaf count of the forest ``shape``: :math:`L = B\,b_1 \cdots b_D`.

    Always true where it is called; in eager mode, a few integer comparisons. Under
    ``torch.compile`` with dynamic shapes, each input's ``L`` and the forest's ``B`` are
    separate symbols until this ties them; then every level's size is a multiple of ``B``
    and :func:`family_layout`'s family sizes stay literal. Untied, each view's family size
    is an expression in ``L`` (``unflatten(1, (-1, b))`` of ``L`` rows gives ``b`` as
    ``L // (L // b)``) that nests deeper with every level: a new batch shape of the strictly
    causal op took more than 4 minutes to recompile (37 s tied), one of the bidirectional
    op 57 s (22 s tied), and inductor stopped on the hub op's sizes."""
    leaves = math.prod(shape)
    for x in rows:
        if x is not None:
            torch._check(x.size(0) == leaves)


def heads_first(x: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """``[L, H, ...]`` rows as a contiguous ``[H, L, ...]``, in ``dtype`` (default: ``x``'s;
    one copy, none when ``x`` is a transposed view of heads-first memory in ``dtype``).

    The gradient comes back in one pass too, in ``x``'s dtype and memory layout (contiguous,
    or heads first), so that nothing downstream copies it again. Traced by
    ``torch.compile``, it is the plain copy."""
    dtype = dtype or x.dtype
    if dtype == x.dtype and is_heads_first(x):
        return x.transpose(0, 1)
    if torch.compiler.is_compiling():
        return _contiguous(x.transpose(0, 1), dtype)
    return _HeadsFirst.apply(x, dtype)


class _HeadsFirst(AutogradFunction):
    @staticmethod
    def forward(ctx, x: Tensor, dtype: torch.dtype) -> Tensor:
        ctx.x_dtype, ctx.x_heads_first = x.dtype, is_heads_first(x)
        return _contiguous(x.transpose(0, 1), dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        if ctx.x_heads_first:  # x's memory is [H, L, ...]: so is its gradient's
            return _contiguous(grad, ctx.x_dtype).transpose(0, 1), None
        return _contiguous(grad.transpose(0, 1), ctx.x_dtype), None


def _contiguous(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` in contiguous memory and in ``dtype``: one copy, none if it is already.
    (``x.to(dtype, memory_format=torch.contiguous_format)`` alone would return a
    non-contiguous ``x`` of that dtype as it is.)"""
    if x.dtype == dtype:
        return x.contiguous()
    return x.to(dtype, memory_format=torch.contiguous_format)


def is_heads_first(x: Tensor) -> bool:
    """Whether the ``[L, H, ...]`` rows ``x`` are a view of contiguous ``[H, L, ...]`` (read
    from the strides: no operation dispatched)."""
    if x.numel() == 0:
        return True
    sizes, strides = list(x.shape), list(x.stride())
    sizes[:2], strides[:2] = sizes[1::-1], strides[1::-1]
    expected = 1
    for size, stride in zip(reversed(sizes), reversed(strides), strict=True):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def transposed(x: Tensor, scale: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """``(x * scale).transpose(0, 1)`` in contiguous memory and in ``dtype`` (default:
    ``x``'s), written in one pass (``scale`` broadcasts against ``x`` with as many
    dimensions, and gets no gradient); differentiable twice in ``x``, whose gradient comes
    back in its dtype in one pass too. Traced by ``torch.compile``, it is the plain product,
    which inductor fuses with the copy itself."""
    dtype = dtype or x.dtype
    scale = scale.to(torch.promote_types(x.dtype, dtype))
    if torch.compiler.is_compiling():
        return (x * scale).transpose(0, 1).to(dtype, memory_format=torch.contiguous_format)
    return _Transposed.apply(x, scale, dtype)


class _Transposed(AutogradFunction):
    @staticmethod
    def forward(ctx, x: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
        ctx.save_for_backward(scale)
        ctx.x_dtype = x.dtype
        out = x.new_empty(x.transpose(0, 1).shape, dtype=dtype)
        return torch.mul(x.transpose(0, 1), scale.transpose(0, 1), out=out)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (scale,) = ctx.saved_tensors
        return _Transposed.apply(grad, scale.transpose(0, 1), ctx.x_dtype), None, None


def like(out: Tensor, q: Tensor, weight: Tensor | None = None) -> Tensor:
    """The heads-first output ``[H, L, ...]`` as ``[L, H, ...]`` in ``q``'s memory layout
    and dtype: a view when ``q`` is heads first (and of ``out``'s dtype), else contiguous;
    with ``weight`` ``[L]``, its rows scaled by it (in the copy, if there is one)."""
    if is_heads_first(q):
        out = out if weight is None else out * weight[:, None].to(out.dtype)
        return out.to(q.dtype).transpose(0, 1)
    if weight is None:
        return heads_first(out, q.dtype)
    return transposed(out, weight[None, :, None], q.dtype)


def dense_gradient(x: Tensor) -> Tensor:
    """``x``, with the gradient that reaches it in the backward made contiguous.

    A broadcast gradient (that of ``out.sum()``: one value with stride 0) would reach
    the batched products of the backward as is, and ``bmm`` runs such operands one
    matrix at a time; any other is passed on unchanged (the strides are static: no
    host sync)."""
    return _DenseGradient.apply(x)


class _DenseGradient(AutogradFunction):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad.contiguous() if 0 in grad.stride() else grad


def per_depth(pos: Tensor, index: TreeIndex) -> list[Tensor]:
    """Rows of the node-order ``pos`` (``[N, H | 1, c]``) of every level below the roots,
    in breadth-first order and node layout: ``[H | 1, n_d, c]`` for ``d = 1 … D``."""
    return [heads_first(rows) for rows in per_level(pos, index)[1:]]


def per_level(x: Tensor, index: TreeIndex) -> list[Tensor]:
    """The rows of the node-order ``x`` (``[N, ...]``) of every level, in breadth-first
    order: ``[n_d, ...]`` for ``d = 0 … D``. One permutation and a split, whose backward is
    a concatenation and the inverse permutation (a gather or slice per level would zero a
    gradient the size of ``x`` for each)."""
    return list(permute_rows(x, index.order, index.rank).split(index.level_sizes))
