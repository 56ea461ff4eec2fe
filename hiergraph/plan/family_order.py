"""The child order of a forest: children grouped by parent, in ``slot`` order."""

from __future__ import annotations

import torch
from torch import Tensor

#: Combined sort keys ``parent_key * (max(slot) + 1) + slot`` stay below this.
_KEY_LIMIT = 2**62


def family_order(parent_key: Tensor, slot: Tensor) -> Tensor:
    """The permutation that sorts nodes by ``(parent_key, slot)``, ties kept in input order.

    One stable sort of the key :func:`combined_key` where it fits int64 (the usual case:
    ranks and child positions); else two stable sorts (by ``slot``, then by
    ``parent_key``), which order any int64 values (e.g. nanosecond timestamps as slots).

    Args:
        parent_key: ``[n]`` int64, the sort key of each node's parent (its id, or its
            breadth-first rank).
        slot: ``[n]`` int64 slots.

    Returns:
        ``[n]`` int64 permutation.
    """
    key = combined_key(parent_key, slot)
    if key is not None:
        return key.argsort(stable=True)
    by_slot = slot.argsort(stable=True)
    return by_slot.index_select(0, parent_key.index_select(0, by_slot).argsort(stable=True))


def combined_key(parent_key: Tensor, slot: Tensor) -> Tensor | None:
    """``parent_key * (max(slot) + 1) + slot``, which orders as ``(parent_key, slot)``, where
    both are non-negative and every key stays below :data:`_KEY_LIMIT`; else ``None``.
    Reads the extremes of both on the host, at once."""
    if not slot.numel():
        return None
    low_key, top, low, high = torch.stack(
        [*torch.aminmax(parent_key), *torch.aminmax(slot)]
    ).tolist()
    if min(low_key, low) < 0 or (top + 1) * (high + 1) > _KEY_LIMIT:
        return None
    return parent_key * (high + 1) + slot
