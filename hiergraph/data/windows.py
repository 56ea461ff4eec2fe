"""Fixed hopping-window hierarchies over a sequence (notes/hsa.md §3.3)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from hiergraph.data.domain import Domain
from hiergraph.data.signal_hierarchy import SignalHierarchy


def window_hierarchy(
    n: int, branching: Sequence[int] = (2, 4, 8, 16), x: Tensor | None = None
) -> SignalHierarchy:
    r"""Non-overlapping hopping windows over ``n`` tokens, built bottom-up.

    Level 1 groups the tokens into windows of ``branching[0]``, level 2 groups
    those windows into windows of ``branching[1]``, and so on; the last window
    of a level may be partial. After the tuple is used up, one root takes all
    remaining nodes (the *remainder root*). Building stops early once a level
    has a single node, which becomes the root. Every family is a 1-D grid and
    a child's position is its index in its window.

    For ``n = 10, branching = (2, 4)``: 5 windows of 2 tokens, 2 windows of
    (4, 1) windows, and a root over those 2.

    Args:
        n: number of tokens (leaves), ``n >= 1``.
        branching: bottom-up window sizes, each ``>= 2``.
        x: optional ``[n, F]`` token features.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    branching = tuple(branching)
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 2 for b in branching):
        raise ValueError(f"branching factors must be ints >= 2, got {branching}")

    parents, slots, sizes = [], [], [n]
    level_size, offset = n, 0  # nodes of the current level are offset .. offset + level_size - 1
    for b in (*branching, None):
        if level_size == 1:
            break
        width = level_size if b is None else b
        num_windows = -(-level_size // width)
        local = torch.arange(level_size)
        parents.append(offset + level_size + local // width)
        slots.append(local % width)
        offset, level_size = offset + level_size, num_windows
        sizes.append(num_windows)
    num_nodes = offset + 1
    parent = torch.cat([*parents, torch.tensor([num_nodes - 1])])
    slot = torch.cat([*slots, torch.tensor([0])])
    # level l (bottom-up, leaves = 0) sits at depth len(sizes) - 1 - l
    depth = torch.arange(len(sizes) - 1, -1, -1).repeat_interleave(torch.tensor(sizes))
    is_leaf = torch.zeros(num_nodes, dtype=torch.bool)
    is_leaf[:n] = True
    domain = torch.full((num_nodes,), int(Domain.GRID1D), dtype=torch.long)
    domain[-1] = int(Domain.NONE)
    return SignalHierarchy._assemble(
        parent=parent,
        is_leaf=is_leaf,
        depth=depth,
        slot=slot,
        node_type=torch.zeros(num_nodes, dtype=torch.long),
        domain=domain,
        pos=torch.stack([slot, torch.zeros_like(slot)], dim=1),
        x=x,
    )
