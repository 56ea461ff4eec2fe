"""The structural plan of a forest that every hierarchical attention op shares."""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property

import torch
from torch import Tensor


def bucket_width(size: int) -> int:
    """Padded width of a family of ``size`` siblings: the next value of 1, 2, 3, 4, 6, 8, 12, ….

    Rounding up to powers of two and 1.5 × powers of two bounds the padding
    waste of the dense family kernel to < 1.5× per dimension while keeping
    the number of size buckets logarithmic in the largest family.
    """
    if size <= 4:
        return size
    p = 1 << (size - 1).bit_length()  # next power of two
    return p * 3 // 4 if size <= p * 3 // 4 else p


@dataclass
class TreeIndex:
    r"""Breadth-first layout of a forest of signal hierarchies.

    Nodes are laid out in breadth-first (BFS) order: depth level by depth
    level, and inside a level grouped by parent (in the parent's BFS order)
    and then by ``slot``. In this order every *level* is a contiguous range
    ``level_ptr[d]:level_ptr[d+1]`` and every *family* (the children of one
    node) is a contiguous run sorted by child order. All per-level passes of
    HSA are then gathers/scatters between neighbouring ranges, and the
    families can be cut into dense ``[F, b, ·]`` blocks without sorting.

    Build it with :meth:`from_hierarchy` (or ``hierarchy.tree_index()``,
    which caches it); it depends on the structure only and is reused by
    every layer and head.

    Attributes (``N`` nodes, ``L`` leaves, ``D`` depth levels):
        order: ``[N]`` node id at each BFS position.
        rank: ``[N]`` BFS position of each node id (inverse of ``order``).
        level_ptr: ``D + 1`` Python ints.
        parent_local: per level ``d >= 1``, ``[n_d]`` index of each node's
            parent inside level ``d - 1``; ``parent_local[0]`` is empty.
        leaf_pos: ``[L]`` BFS position of each leaf, in leaf order.
        level_leaf_local / level_leaf_id: per level, the in-level positions
            of the leaves on that level and their leaf-order indices.
        family_start, family_size: ``[F]`` BFS start and size of each family.
        buckets: list of ``(index [F_b, W], valid [F_b, W])`` for the dense
            family kernel: BFS positions of the members of every family whose
            padded width is ``W``; padding points at position ``N``.
        bucket_back: ``[N - n_0]`` for each non-root BFS position, its row in
            the concatenation of all flattened bucket blocks.
    """

    num_nodes: int
    num_leaves: int
    order: Tensor
    rank: Tensor
    level_ptr: list[int]
    parent_local: list[Tensor]
    leaf_pos: Tensor
    level_leaf_local: list[Tensor]
    level_leaf_id: list[Tensor]
    family_start: Tensor
    family_size: Tensor
    buckets: list[tuple[Tensor, Tensor]]
    bucket_back: Tensor

    @property
    def num_levels(self) -> int:
        return len(self.level_ptr) - 1

    @property
    def device(self) -> torch.device:
        return self.order.device

    @classmethod
    def from_hierarchy(cls, hierarchy) -> TreeIndex:
        """Plan for a :class:`~hiergraph.data.SignalHierarchy` or a batch of them."""
        return cls.from_parent(hierarchy.parent, hierarchy.slot, hierarchy.is_leaf)

    @classmethod
    def from_parent(cls, parent: Tensor, slot: Tensor, is_leaf: Tensor) -> TreeIndex:
        """Plan from ``[N]`` ``parent`` (roots point at themselves), ``slot`` and ``is_leaf``."""
        device = parent.device
        n = parent.numel()
        nodes = torch.arange(n, device=device)
        is_root = parent == nodes
        slot_range = int(slot.max()) + 1 if n else 1

        # BFS order, level by level: sort each level by (parent's BFS rank, slot).
        rank = torch.full((n,), -1, dtype=torch.long, device=device)
        level = nodes[is_root]
        levels = []
        filled = 0
        while level.numel():
            rank[level] = torch.arange(filled, filled + level.numel(), device=device)
            filled += level.numel()
            levels.append(level)
            children = nodes[~is_root & (rank[parent] >= 0) & (rank < 0)]
            key = rank[parent[children]] * slot_range + slot[children]
            level = children[torch.argsort(key)]
        if filled != n:
            raise ValueError("parent does not describe a forest: some nodes never reach a root")
        order = torch.cat(levels)
        sizes = [lv.numel() for lv in levels]
        level_ptr = [0]
        for s in sizes:
            level_ptr.append(level_ptr[-1] + s)

        parent_pos = rank[parent[order]]  # BFS position of each position's parent
        parent_local = [parent_pos.new_empty(0)]
        for d in range(1, len(sizes)):
            lo, hi = level_ptr[d], level_ptr[d + 1]
            parent_local.append(parent_pos[lo:hi] - level_ptr[d - 1])

        leaf_nodes = nodes[is_leaf]
        leaf_pos = rank[leaf_nodes]
        leaf_id_at = torch.full((n,), -1, dtype=torch.long, device=device)
        leaf_id_at[leaf_pos] = torch.arange(leaf_nodes.numel(), device=device)
        level_leaf_local, level_leaf_id = [], []
        for d in range(len(sizes)):
            ids = leaf_id_at[level_ptr[d] : level_ptr[d + 1]]
            local = (ids >= 0).nonzero().view(-1)
            level_leaf_local.append(local)
            level_leaf_id.append(ids[local])

        # Families: contiguous runs of equal parent among non-root positions.
        n0 = level_ptr[1] if len(level_ptr) > 1 else n
        fam_parent = parent_pos[n0:]
        if fam_parent.numel():
            is_start = torch.ones_like(fam_parent, dtype=torch.bool)
            is_start[1:] = fam_parent[1:] != fam_parent[:-1]
            family_start = is_start.nonzero().view(-1) + n0
            family_size = torch.diff(family_start, append=family_start.new_tensor([n]))
        else:
            family_start = fam_parent.new_empty(0)
            family_size = fam_parent.new_empty(0)
        buckets, bucket_back = cls._make_buckets(family_start, family_size, n, n0)
        return cls(
            num_nodes=n,
            num_leaves=leaf_nodes.numel(),
            order=order,
            rank=rank,
            level_ptr=level_ptr,
            parent_local=parent_local,
            leaf_pos=leaf_pos,
            level_leaf_local=level_leaf_local,
            level_leaf_id=level_leaf_id,
            family_start=family_start,
            family_size=family_size,
            buckets=buckets,
            bucket_back=bucket_back,
        )

    @staticmethod
    def _make_buckets(family_start: Tensor, family_size: Tensor, n: int, n0: int):
        device = family_start.device
        sizes, inverse = family_size.unique(return_inverse=True)
        widths = torch.tensor([bucket_width(int(s)) for s in sizes.tolist()], dtype=torch.long)
        fam_width = widths.to(device)[inverse]
        buckets = []
        back = torch.empty(n - n0, dtype=torch.long, device=device)
        offset = 0
        for w in widths.unique().tolist():
            fams = (fam_width == w).nonzero().view(-1)
            local = torch.arange(w, device=device)
            start, size = family_start[fams], family_size[fams]
            valid = local < size[:, None]
            index = torch.where(valid, start[:, None] + local, n)
            buckets.append((index, valid))
            flat = offset + torch.arange(index.numel(), device=device).view_as(index)
            back[index[valid] - n0] = flat[valid]
            offset += index.numel()
        return buckets, back

    @cached_property
    def sibling_pairs(self) -> Tensor:
        """``[2, S]`` BFS positions ``(query, key)`` of every ordered pair of distinct siblings.

        ``S = sum_f b_f (b_f - 1)``; used by the edge-list family kernel.
        Pairs are grouped by query, keys in child order.
        """
        size, start = self.family_size, self.family_start
        # one row per (member, other member) including the diagonal, then drop it
        member_size = size.repeat_interleave(size)
        member_pos = torch.arange(int(size.sum()), device=self.device) + int(self.level_ptr[1])
        member_start = start.repeat_interleave(size)
        query = member_pos.repeat_interleave(member_size)
        first = torch.cumsum(member_size, 0) - member_size
        offset = torch.arange(query.numel(), device=self.device) - first.repeat_interleave(
            member_size
        )
        key = member_start.repeat_interleave(member_size) + offset
        keep = query != key
        return torch.stack([query[keep], key[keep]])

    def to(self, device) -> TreeIndex:
        """A copy with every tensor moved to ``device``."""
        moved = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                value = value.to(device)
            elif isinstance(value, list) and value and isinstance(value[0], Tensor):
                value = [v.to(device) for v in value]
            elif isinstance(value, list) and value and isinstance(value[0], tuple):
                value = [tuple(t.to(device) for t in v) for v in value]
            moved[f.name] = value
        return TreeIndex(**moved)
