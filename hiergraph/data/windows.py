"""Hopping-window hierarchies over a sequence (notes/hsa.md §3.3)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
    branching = _check(n, branching)

    def sizes(level: int, count: int) -> Tensor:
        width = branching[level]
        full, rest = divmod(count, width)
        return torch.tensor([width] * full + ([rest] if rest else []), dtype=torch.long)

    return _hopping(n, len(branching), sizes, x)


def random_window_hierarchy(
    n: int,
    branching: Sequence[int] = (16, 8, 4, 2),
    x: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> SignalHierarchy:
    """Like :func:`window_hierarchy`, but every window's size is drawn uniformly from
    ``[1, 2 b - 1]`` (mean ``b``): a ragged hierarchy with the same mean branching.

    A synthetic structure for tests and benchmarks.
    """
    branching = _check(n, branching)

    def sizes(level: int, count: int) -> Tensor:
        b = branching[level]
        draws = torch.randint(1, 2 * b, (count,), generator=generator)
        ends = torch.cumsum(draws, 0)
        k = int(torch.searchsorted(ends, torch.tensor(count))) + 1
        out = draws[:k].clone()
        out[-1] -= int(ends[k - 1]) - count
        return out

    return _hopping(n, len(branching), sizes, x)


def _check(n, branching) -> tuple[int, ...]:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    branching = tuple(branching)
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 2 for b in branching):
        raise ValueError(f"branching factors must be ints >= 2, got {branching}")
    return branching


def _hopping(
    n: int, num_levels: int, sizes: Callable[[int, int], Tensor], x: Tensor | None
) -> SignalHierarchy:
    """Stack window levels bottom-up; ``sizes(level, count)`` cuts ``count`` nodes into windows."""
    parents, slots, counts = [], [], [n]
    level_size, offset = n, 0  # nodes of the current level are offset .. offset + level_size - 1
    for level in range(num_levels + 1):
        if level_size == 1:
            break
        widths = sizes(level, level_size) if level < num_levels else torch.tensor([level_size])
        window = torch.arange(widths.numel()).repeat_interleave(widths)
        first = torch.cumsum(widths, 0) - widths
        parents.append(offset + level_size + window)
        slots.append(torch.arange(level_size) - first[window])
        offset, level_size = offset + level_size, widths.numel()
        counts.append(level_size)
    num_nodes = offset + 1
    parent = torch.cat([*parents, torch.tensor([num_nodes - 1])])
    slot = torch.cat([*slots, torch.tensor([0])])
    # level l (bottom-up, leaves = 0) sits at depth len(counts) - 1 - l
    depth = torch.arange(len(counts) - 1, -1, -1).repeat_interleave(torch.tensor(counts))
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
