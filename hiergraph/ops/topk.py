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
    sorts, :math:`O(M \log M)`; no gradient (a discrete choice).

    Args:
        scores: ``[M]`` scores (larger = chosen first).
        group: ``[M]`` int64 group id of every entry (``>= 0``, any order).
        k: entries per group, ``>= 0``.
    """
    order = torch.sort(scores, descending=True, stable=True).indices
    order = order[torch.sort(group[order], stable=True).indices]  # by group, then by score
    sizes = torch.bincount(group)
    first = torch.cumsum(sizes, 0) - sizes
    rank = torch.arange(order.numel(), device=scores.device) - first[group[order]]
    chosen = torch.zeros_like(group, dtype=torch.bool)
    chosen[order[rank < k]] = True
    return chosen
