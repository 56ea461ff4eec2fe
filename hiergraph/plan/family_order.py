"""The child order of a forest: children grouped by parent, in ``slot`` order."""

from __future__ import annotations

from torch import Tensor


def family_order(parent_key: Tensor, slot: Tensor) -> Tensor:
    """The permutation that sorts nodes by ``(parent_key, slot)``, ties kept in input order.

    Two stable sorts (by ``slot``, then by ``parent_key``) instead of one combined key
    ``parent_key * (max(slot) + 1) + slot``, which overflows int64 for large slots
    (e.g. nanosecond timestamps): any int64 values order correctly.

    Args:
        parent_key: ``[n]`` int64, the sort key of each node's parent (its id, or its
            breadth-first rank).
        slot: ``[n]`` int64 slots.

    Returns:
        ``[n]`` int64 permutation.
    """
    by_slot = slot.argsort(stable=True)
    return by_slot.index_select(0, parent_key.index_select(0, by_slot).argsort(stable=True))
