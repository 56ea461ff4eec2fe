r"""Sibling ("family") attention over pooled node statistics, the black box of HSA (App. E.3):
its logits and the terms its kernels share.

Every node :math:`C` of a level attends to its siblings :math:`B` (the other
children of its parent) with logits

.. math::
    s(C, B) = \tau\,\rho_q(C)^\top\rho_k(B) + \varepsilon(C)^\top\varepsilon(B) + \log n(B),

over the keys with :math:`n(B) > 0` (and :math:`B` left of :math:`C` with
``left_only``, the sibling masking of App. G.1). With ``size_bias=False`` the
:math:`\log n(B)` term is dropped: every sibling sub-tree weighs as one token (an
ablation; Thm. 3.2 needs the term).
Its kernels return the log-partition
:math:`\mathrm{lse}(C) = \log\sum_B e^{s(C,B)}` (``-inf`` without keys) and
:math:`\vartheta(C) = \sum_B \mathrm{softmax}_B\,s(C,\cdot)\,\rho_v(B)` (0
without keys); those of a level also its sums of pooled queries, keys and values per
parent (the parents' rows, from the same pass):

* :func:`~hiergraph.ops.hsa.family_dense.family_attention_dense` runs every
  :class:`~hiergraph.plan.family_block.FamilyBlock` as batched matrix products;
* :func:`~hiergraph.ops.hsa.family_edge.family_attention_edge` is a scatter softmax over
  the list of sibling pairs: the general reference path;
* :mod:`~hiergraph.ops.hsa.family_fused` runs families in PyTorch's fused CPU attention
  kernel: the dense kernel's wide blocks, and the leaf families of the equal-fanout paths
  (:func:`~hiergraph.ops.hsa.family_fused.leaf_family_attention`).

This module holds the terms those kernels and the equal-fanout paths share, per level
``[n]`` or per family ``[..., b]``: the key terms :math:`\log n(B)` and :math:`n(B) > 0`
(:func:`key_bias`), the pairs ``[b, b]`` a family's softmax leaves out (:func:`left_out`),
the softmax of families of two in closed form (:func:`sibling_of_two`), and a parent's
energy from its children's, weighted by their shares :math:`n(C) / n(A)` of its leaves
(:func:`child_shares`, :func:`count_weighted_sum`). The batched products over families that
the kernels and the equal-fanout paths are made of are in
:mod:`~hiergraph.ops.hsa.family_products`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hiergraph.ops.hsa.family_products import family_diagonal


def key_bias(count: Tensor, size_bias: bool, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    r"""The key terms of the sibling logits: :math:`\log n(B)` (0 without the size bias)
    and the mask :math:`n(B) > 0`, for every node of a level (``count`` ``[n]``).

    The log is taken in ``count``'s dtype (float32 for half-precision inputs, see
    :func:`~hiergraph.ops.hsa.attention.hierarchical_attention`) and only then cast to ``dtype``,
    so counts past the half-precision range stay exact."""
    ok = count > 0
    bias = torch.log(count.clamp(min=1)) if size_bias else torch.zeros_like(count)
    return bias.to(dtype), ok


def child_shares(n: Tensor, denom: Tensor | None = None) -> Tensor:
    r"""The children's shares :math:`n(C) / n(A)` ``[1, F, b]`` of their parents' leaves, from
    their leaf counts ``n [1, F, b]`` and the parents' ``denom [1, F]`` (at least 1; default:
    the sum of their children's counts, at least 1). A child without leaves has share 0."""
    if denom is None:
        return n / n.sum(-1, keepdim=True).clamp(min=1)
    return n / denom.unsqueeze(-1)


def count_weighted_sum(
    total: Tensor, share: Tensor, dtype: torch.dtype, finite: bool = False
) -> Tensor:
    r""":math:`\sum_C n(C) / n(A)\, t(C)` ``[H, F]`` over the children :math:`C` of every
    parent :math:`A`, from ``total [H, F, b]`` in family layout and the children's shares
    ``share [1, F, b]`` (:func:`child_shares`), summed in ``dtype``: a parent's energy from
    its children's. Children without leaves weigh 0 whatever their value (an energy may be
    ``-inf`` there), with a zero gradient (their share is 0, and so is the value they
    enter with); ``finite``: the caller guarantees finite values (two operations instead
    of four)."""
    share = share.to(total.dtype)
    if not finite:
        total = torch.where(share > 0, total, 0.0)
    return (share * total).sum(-1, dtype=dtype)


def left_out(b: int, left_only: bool, device) -> Tensor:
    """``[b, b]``, true for the sibling pairs a family's softmax leaves out: a node itself,
    and with ``left_only`` its right siblings."""
    ar = torch.arange(b, device=device)
    return ar[None, :] >= ar[:, None] if left_only else ar[None, :] == ar[:, None]


def sibling_of_two(logits: Tensor, keys: Tensor | None = None) -> tuple[Tensor, Tensor]:
    r"""``lse [..., 2]`` and ``p [..., 2, 2]`` (a broadcast view) of the (biased) logits
    ``[..., 2, 2]`` of families of two without ``left_only``, as
    :func:`~hiergraph.ops.logspace.softmax_dropping` gives them: a node's one key is its
    sibling :math:`B`, whose weight is 1 and :math:`\mathrm{lse}` its logit; with ``keys``
    (broadcastable to ``[..., 2]``, false for nodes without leaves) a sibling that
    is no key gives weight 0 and :math:`\mathrm{lse} = -\infty`. No softmax passes; the
    weights are constants."""
    lse = family_diagonal(logits.flip(-1))  # s(C, sibling of C)
    swap = 1.0 - torch.eye(2, dtype=logits.dtype, device=logits.device)
    if keys is None:
        return lse, swap.expand_as(logits)
    lse = torch.where(keys.flip(-1), lse, float("-inf"))
    return lse, (swap * keys.unsqueeze(-2).to(logits.dtype)).expand_as(logits)
