"""Gathers of distinct rows whose backward is a copy or a gather, not an accumulation."""

from __future__ import annotations

from torch import Tensor

from hiergraph._autograd import AutogradFunction


class _TakeRows(AutogradFunction):
    """``x.index_select(dim, index)`` for *distinct* indices; the backward writes the
    gradient rows into zeros with ``index_copy`` (no accumulation needed, where
    ``index_select``'s own backward adds them, which is slower and, on accelerators,
    ordered by atomics)."""

    @staticmethod
    def forward(ctx, x: Tensor, index: Tensor, dim: int) -> Tensor:
        ctx.save_for_backward(index)
        ctx.shape, ctx.dim = x.shape, dim
        return x.index_select(dim, index)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (index,) = ctx.saved_tensors
        zeros = grad.new_zeros(ctx.shape)
        return zeros.index_copy_(ctx.dim, index, grad), None, None


def take_rows(x: Tensor, index: Tensor, dim: int = 0) -> Tensor:
    """``x.index_select(dim, index)`` for distinct ``index`` (a partial permutation), with a
    copy-only backward (itself differentiable: second derivatives work)."""
    return _TakeRows.apply(x, index, dim)


class _PermuteRows(AutogradFunction):
    """``x.index_select(dim, perm)`` for a permutation ``perm`` of the rows; the backward is
    the gather by the inverse permutation (``index_select``'s own backward zeroes a
    gradient of ``x``'s size and adds the rows into it)."""

    @staticmethod
    def forward(ctx, x: Tensor, perm: Tensor, inverse: Tensor, dim: int) -> Tensor:
        ctx.save_for_backward(perm, inverse)
        ctx.dim = dim
        return x.index_select(dim, perm)

    @staticmethod
    def backward(ctx, grad: Tensor):
        perm, inverse = ctx.saved_tensors
        return permute_rows(grad, inverse, perm, ctx.dim), None, None, None


def permute_rows(x: Tensor, perm: Tensor, inverse: Tensor, dim: int = 0) -> Tensor:
    """``x.index_select(dim, perm)`` for a permutation ``perm`` of ``x.size(dim)`` rows
    whose inverse is ``inverse``: the backward is the gather by ``inverse`` (itself
    differentiable: second derivatives work)."""
    return _PermuteRows.apply(x, perm, inverse, dim)
