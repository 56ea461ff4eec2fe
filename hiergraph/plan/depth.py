"""The depth of every node of a forest, by pointer doubling."""

from __future__ import annotations

import torch
from torch import Tensor


def node_depth(parent: Tensor) -> tuple[Tensor, Tensor]:
    r"""The depth of every node (its parent links up to its root) and whether it reaches one.

    ``parent`` ``[N]`` holds node ids, a root being its own parent. Pointer doubling: with
    ``up[x]`` the ancestor :math:`2^k` links above ``x`` (its root if fewer) and
    ``depth[x]`` the links to it, one step is

    .. math::
        \mathrm{depth} \leftarrow \mathrm{depth} + \mathrm{depth}[\mathrm{up}], \qquad
        \mathrm{up} \leftarrow \mathrm{up}[\mathrm{up}],

    so a forest of depth :math:`D` takes :math:`\lceil \log_2 D \rceil` steps,
    :math:`O(N \log D)` work (a breadth-first search, one pass over the unplaced nodes per
    level, is :math:`O(N D)`: quadratic on a chain).

    Returns:
        ``depth`` ``[N]`` int64 (the root's is 0; meaningless for a node that reaches no
        root) and ``reaches`` ``[N]`` bool, false for the nodes on or below a cycle.
    """
    nodes = torch.arange(parent.numel(), device=parent.device)
    is_root = parent == nodes
    up, depth = parent, (~is_root).long()
    for _ in range(max(parent.numel() - 1, 1).bit_length()):  # 2^steps >= N - 1 links
        if bool(is_root.index_select(0, up).all()):
            break
        depth = depth + depth.index_select(0, up)
        up = up.index_select(0, up)
    return depth, is_root.index_select(0, up)
