"""The child order of a forest: children grouped by parent, in ``slot`` order."""

from __future__ import annotations

import torch
from torch import Tensor

#: Combined sort keys ``parent_key * (max(slot) + 1) + slot`` stay below this.
_KEY_LIMIT = 2**62


def family_order(parent_key: Tensor, slot: Tensor) -> Tensor:
    """The permutation that sorts nodes by ``(parent_key, slot)``, ties kept in input order.

    One stable sort of the key ``parent_key * (max(slot) + 1) + slot`` where both are
    non-negative and the key fits int64 (the usual case: ranks and child positions);
    else two stable sorts (by ``slot``, then by ``parent_key``), which order any int64
    values (e.g. nanosecond timestamps as slots). Reads the keys' extremes on the host.

    Args:
        parent_key: ``[n]`` int64, the sort key of each node's parent (its id, or its
            breadth-first rank).
        slot: ``[n]`` int64 slots.

    Returns:
        ``[n]`` int64 permutation.
    """
    if slot.numel():
        low, high, top = torch.stack([*torch.aminmax(slot), parent_key.max()]).tolist()
        low_key = int(parent_key.min())
        if min(low, low_key) >= 0 and (top + 1) * (high + 1) <= _KEY_LIMIT:
            return (parent_key * (high + 1) + slot).argsort(stable=True)
    by_slot = slot.argsort(stable=True)
    return by_slot.index_select(0, parent_key.index_select(0, by_slot).argsort(stable=True))
