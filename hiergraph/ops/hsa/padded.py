r"""HSA over a forest embedded in an equal-fanout forest (:mod:`hiergraph.plan.padded_forest`).

The leaves' ``q, k, v`` are scattered into the padded forest's leaf slots, heads first (one
copy each, the copy the reshaped-view path would make anyway), the padding slots are
masked leaves, :func:`~hiergraph.ops.hsa.uniform.uniform_hierarchical_attention` runs on
the padded forest, and the real slots are read back. The result is that of the forest
itself (the module docstring of :mod:`hiergraph.plan.padded_forest` says why).
"""

from __future__ import annotations

import torch
from torch import Tensor

from hiergraph.ops.hsa.heads_first import heads_first, is_heads_first
from hiergraph.ops.hsa.uniform import uniform_hierarchical_attention
from hiergraph.ops.rows import take_rows
from hiergraph.plan.padded_forest import PaddedForest
from hiergraph.plan.tree_index import TreeIndex


def padded_hierarchical_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    index: TreeIndex,
    forest: PaddedForest,
    pos: Tensor | None,
    *,
    include_self: bool,
    left_only: bool,
    leaf_mask: Tensor | None,
    tau: float,
    size_bias: bool,
) -> Tensor:
    r"""HSA of ``q, k [L, H, d]``, ``v [L, H, d_v]`` over ``index``'s forest, run on its
    embedding ``forest``.

    Args:
        pos: optional ``[N, H | 1, c]`` position embeddings in node order.
        include_self, leaf_mask, size_bias: as in
            :func:`~hiergraph.ops.hierarchical_attention`.
        left_only: its ``leaky_causal``.
        tau: the logit scale.

    Returns:
        ``[L, H, d_v]``, heads first in memory when ``q`` is.
    """
    return on_slots(
        uniform_hierarchical_attention, q, k, v, index, forest, pos,
        include_self=include_self, left_only=left_only, leaf_mask=slot_mask(forest, leaf_mask),
        tau=tau, size_bias=size_bias,
        padding=leaf_mask is None,  # else masked leaves have rows and read outputs
    )  # fmt: skip


def on_slots(op, q, k, v, index: TreeIndex, forest: PaddedForest, pos, **options) -> Tensor:
    """``op(q, k, v, shape, eps, **options)``, an op over the equal-fanout forest ``shape``
    with position embeddings per depth, run on the slots of ``index``'s embedding
    ``forest``: the leaves' rows of ``q, k, v`` in their slots, ``pos`` ``[N, H | 1, c]``
    (or ``None``) per padded depth, and the leaves' rows of the output read back (heads
    first in memory when ``q`` is)."""
    eps = None if pos is None else per_depth_padded(pos, index, forest)
    out = op(*(to_slots(t, forest) for t in (q, k, v)), forest.shape, eps, **options)
    return from_slots(out, forest, q)


def slot_mask(forest: PaddedForest, leaf_mask: Tensor | None) -> Tensor:
    """``[slots]`` bool: ``leaf_mask`` ``[L]`` at the leaves' slots (``True`` for every leaf
    without it), ``False`` at the padding slots."""
    if leaf_mask is None:
        return forest.real
    return forest.real.new_zeros(forest.real.shape).index_copy_(0, forest.leaf_slot, leaf_mask)


def to_slots(x: Tensor, forest: PaddedForest) -> Tensor:
    """Leaf rows ``[L, H, c]`` in the padded leaf slots, zero elsewhere: ``[slots, H, c]``
    with heads-first memory."""
    heads, width = x.shape[1:]
    out = x.new_zeros(heads, forest.num_slots, width)
    return out.index_copy_(1, forest.leaf_slot, x.transpose(0, 1)).transpose(0, 1)


def from_slots(out: Tensor, forest: PaddedForest, q: Tensor) -> Tensor:
    """The leaves' rows ``[L, H, c]`` of ``out`` ``[slots, H, c]`` (heads first in memory),
    heads first in memory when ``q`` is."""
    if is_heads_first(q):
        return take_rows(out.transpose(0, 1), forest.leaf_slot, dim=1).transpose(0, 1)
    return take_rows(out, forest.leaf_slot)


def per_depth_padded(pos: Tensor, index: TreeIndex, forest: PaddedForest) -> list[Tensor]:
    """The position embeddings of the padded nodes of every depth ``d = 1 … D``, each
    ``[H | 1, n_d, c]`` (zero at padding), from ``pos`` ``[N, H | 1, c]`` in node order."""
    source = torch.cat(forest.node_source)  # one gather for all depths
    rows = pos.index_select(0, index.order.index_select(0, source.clamp(min=0)))
    rows = rows.masked_fill((source < 0)[:, None, None], 0.0)
    return [heads_first(r) for r in rows.split([s.numel() for s in forest.node_source])]
