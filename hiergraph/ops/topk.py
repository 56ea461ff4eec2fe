"""Top-``k`` selection inside groups (segments of a batch), with deterministic ties."""

from __future__ import annotations

import torch
from torch import Tensor


def top_k_per_group(scores: Tensor, group: Tensor, k: int) -> Tensor:
    r"""``[M]`` bool mask of the ``k`` highest ``scores`` of every group.

    Entry :math:`i` is chosen iff :math:`\mathrm{rank}_i < k`, where
    :math:`\mathrm{rank}_i = |\{j : g_j = g_i,\ (s_j, -j) > (s_i, -i)\}|` is its
    position in its group sorted by descending score (ties: lower index first).
    All entries of a group with at most ``k`` entries are chosen. Two stable
    sorts, :math:`O(M \log M)`; no gradient (a discrete choice), no host synchronisation.

    Args:
        scores: ``[M]`` scores (larger = chosen first).
        group: ``[M]`` int64 group id of every entry (``>= 0``, any order).
        k: entries per group, ``>= 0``.
    """
    order = torch.sort(scores, descending=True, stable=True).indices
    grouped = torch.sort(group[order], stable=True)  # by group, then by score
    order = order[grouped.indices]
    first = torch.searchsorted(grouped.values, grouped.values)  # each group's first position
    rank = torch.arange(order.numel(), device=scores.device) - first
    # order is a permutation: a scatter writes every entry (no boolean mask, no host sync)
    return torch.empty_like(group, dtype=torch.bool).scatter_(0, order, rank < k)
