"""Index arithmetic over runs of consecutive rows (the children of a node, the tokens of a
sequence), shared by the plans and the ops."""

from __future__ import annotations

import torch
from torch import Tensor


def run_ptr(sizes: Tensor) -> Tensor:
    """``[n + 1]`` offsets of ``n`` consecutive runs of ``sizes`` rows: ``0`` then the
    cumulative sums (run ``i`` is rows ``ptr[i] .. ptr[i + 1]``)."""
    return torch.cat([sizes.new_zeros(1), torch.cumsum(sizes, 0)])


def ramp(sizes: Tensor, starts: Tensor | None = None, total: int | None = None) -> Tensor:
    """``start, start + 1, …, start + s - 1`` for every ``s`` in ``sizes`` and ``start`` in
    ``starts`` (default 0), concatenated (one host read, the total, unless ``total``
    gives it)."""
    total = int(sizes.sum()) if total is None else total
    first = torch.cumsum(sizes, 0) - sizes
    if starts is not None:
        first = first - starts
    local = torch.arange(total, device=sizes.device)
    return local - first.repeat_interleave(sizes, output_size=total)


def rank_within(group: Tensor, num_groups: int) -> Tensor:
    """``[n]`` the rank of every item among the items of its ``group`` (``[n]`` ids in
    ``[0, num_groups)``, in any order), counted in item order: ``ramp`` of the group sizes,
    put back in item order."""
    order = torch.argsort(group, stable=True)
    rank = torch.empty_like(group, dtype=torch.long)  # (group may be int32)
    sizes = torch.bincount(group, minlength=num_groups)
    return rank.index_copy_(0, order, ramp(sizes, total=group.numel()))  # (no host read)
