r"""Sums over runs of consecutive rows and their adjoint, the broadcast of a row to its run.

Trees laid out level by level (a :class:`~hiergraph.plan.TreeIndex` level, a level of
VCC's :class:`~hiergraph.ops.vcc.segment_tree.SegmentTree`) keep the children of a node
as a run of consecutive rows, so moving between a level and its parents is

.. math::
    \mathrm{sum}(x)_p = \textstyle\sum_{i \in \mathrm{run}(p)} x_i, \qquad
    \mathrm{broadcast}(y)_i = y_{\mathrm{parent}(i)},

two linear maps that are each other's adjoint. Each is an autograd function whose
backward is the other (a gather, or a run-wise sum), never a scatter with atomics. The
run-wise sum is ``segment_reduce``, except for rows of at least :data:`INDEX_ADD_MIN_WIDTH`
values in eager mode on the CPU, where an ``index_add`` in row order (sequential per
output row there, so just as deterministic) takes a fraction of the time:
``segment_reduce``'s CPU loop costs time in proportion to the row width (about 680 µs
against 110 µs for 3,986 rows of 256 values in 301 runs). Sums of bf16/fp16 rows are
accumulated in float32 and rounded once (a half-precision running sum stalls: bf16 ones
add up to 256).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hiergraph._autograd import AutogradFunction
from hiergraph._precision import accumulation_dtype
from hiergraph.plan.level import Level


def sum_runs(x: Tensor, lengths: Tensor, parent: Tensor | None = None) -> Tensor:
    """``[P, ...]`` sums of the rows of ``x`` (``[n, ...]``) over ``P`` consecutive runs of
    ``lengths`` rows (a run may be empty: its sum is 0). ``parent``: ``[n]`` run of every
    row, if already known (else derived from ``lengths`` for the backward)."""
    return _SumRuns.apply(x, lengths, _parents(lengths, parent))


def broadcast_runs(y: Tensor, lengths: Tensor, parent: Tensor | None = None) -> Tensor:
    """``[n, ...]`` row ``y[p]`` repeated for each of the ``lengths[p]`` rows of run ``p``;
    ``parent``: ``[n]`` run of every row, if already known."""
    return _BroadcastRuns.apply(y, _parents(lengths, parent), lengths)


def sum_children(x: Tensor, level: Level, parent_level: Level) -> Tensor:
    """``[n_{d-1}, ...]`` sums of the rows ``x: [n_d, ...]`` of level ``d`` over each node's
    children (0 for leaves): :func:`sum_runs` over a tree index's levels."""
    return _SumRuns.apply(x, parent_level.num_children, level.parent_local)


def broadcast_to_children(x: Tensor, level: Level, parent_level: Level) -> Tensor:
    """``[n_d, ...]`` row of each node's parent, from ``x: [n_{d-1}, ...]``:
    :func:`broadcast_runs` over a tree index's levels."""
    return _BroadcastRuns.apply(x, level.parent_local, parent_level.num_children)


def _parents(lengths: Tensor, parent: Tensor | None) -> Tensor:
    return torch.repeat_interleave(lengths) if parent is None else parent


#: Values per row from which the CPU sums runs with ``index_add`` (see the module docstring).
INDEX_ADD_MIN_WIDTH = 32


def _run_sums(x: Tensor, lengths: Tensor, parent: Tensor) -> Tensor:
    """Run sums in ``x``'s dtype, accumulated in float32 for bf16/fp16 (static tests of
    dtype, device and shape: no host sync, no graph break)."""
    work = x.to(accumulation_dtype(x.dtype))
    if (
        work.device.type == "cpu"
        and math.prod(work.shape[1:]) >= INDEX_ADD_MIN_WIDTH
        and not torch.compiler.is_compiling()  # inductor's scatter adds with atomics
    ):
        out = work.new_zeros((lengths.numel(), *work.shape[1:])).index_add_(0, parent, work)
    else:
        out = torch.segment_reduce(work, "sum", lengths=lengths, axis=0, unsafe=True)
    return out.to(x.dtype)


class _SumRuns(AutogradFunction):
    """Run sums; the backward is a gather of each row's run."""

    @staticmethod
    def forward(ctx, x: Tensor, lengths: Tensor, parent: Tensor) -> Tensor:
        ctx.save_for_backward(parent)
        return _run_sums(x, lengths, parent)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (parent,) = ctx.saved_tensors
        return grad.index_select(0, parent), None, None


class _BroadcastRuns(AutogradFunction):
    """A gather of each row's run; the backward is a run-wise sum."""

    @staticmethod
    def forward(ctx, y: Tensor, parent: Tensor, lengths: Tensor) -> Tensor:
        ctx.save_for_backward(parent, lengths)
        return y.index_select(0, parent)

    @staticmethod
    def backward(ctx, grad: Tensor):
        parent, lengths = ctx.saved_tensors
        return _SumRuns.apply(grad, lengths, parent), None, None
