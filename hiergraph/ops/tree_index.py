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
class Rows:
    """Rows of a tensor along dim 0: read as a slice when ``index`` is a contiguous range."""

    index: Tensor
    start: int | None

    @classmethod
    def of(cls, index: Tensor) -> Rows:
        n = index.numel()
        contiguous = (
            n > 0 and int(index[-1] - index[0]) == n - 1 and bool((torch.diff(index) == 1).all())
        )
        return cls(index, int(index[0]) if contiguous else None)

    def take(self, x: Tensor) -> Tensor:
        if self.start is not None:
            return x.narrow(0, self.start, self.index.numel())
        return x.index_select(0, self.index)


MIN_RUN = 4  # consecutive equal-size families that become one zero-copy slice block


@dataclass
class FamilyBlock:
    """``count`` families of (padded) width ``width``, run together by the dense family kernel.

    A *slice* block (``start`` set) holds ``count`` consecutive families of
    exactly ``width`` members at BFS positions ``start .. start + count *
    width``: its members are a view, no gather. A *gather* block (``index``
    set) lists the members' BFS positions ``[count, width]``; where ``valid``
    is false the slot is padding and repeats the family's first member (mask
    it out as a key; drop its output).
    """

    width: int
    count: int
    start: int | None = None
    index: Tensor | None = None
    valid: Tensor | None = None

    piece: int | None = None  # slice blocks: the piece of ``TreeIndex.split_sizes``


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
        leaf_node: ``[L]`` node id of each leaf, in leaf order.
        leaf_pos: ``[L]`` BFS position of each leaf, in leaf order (as :class:`Rows`).
        level_leaf_local / level_leaf_id: per level, the in-level positions
            of the leaves on that level and their leaf-order indices (the
            latter as :class:`Rows`).
        leaf_level_perm: leaves listed level by level (in-level order) →
            leaf order; ``None`` when that is already the leaf order.
        family_start, family_size: ``[F]`` BFS start and size of each family.
        blocks: the families cut into :class:`FamilyBlock` s for the dense
            family kernel: runs of at least ``MIN_RUN`` consecutive families
            of equal size become zero-copy slice blocks (window hierarchies
            are almost all slices); the other families are padded into gather
            blocks by :func:`bucket_width`.
        block_back: ``[N - n_0]`` for each non-root BFS position, its row in
            the concatenation of all flattened blocks; ``None`` when that is
            the identity (then no permutation is needed).
        split_sizes: sizes that cut ``[0, N)`` into the slice blocks and the
            gaps between them (one ``split`` reads every slice block).
    """

    num_nodes: int
    num_leaves: int
    order: Tensor
    rank: Tensor
    level_ptr: list[int]
    parent_local: list[Tensor]
    leaf_node: Tensor
    leaf_pos: Rows
    level_leaf_local: list[Tensor]
    level_leaf_id: list[Rows]
    leaf_level_perm: Rows | None
    family_start: Tensor
    family_size: Tensor
    blocks: list[FamilyBlock]
    block_back: Tensor | None
    split_sizes: list[int]

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
            level_leaf_id.append(Rows.of(ids[local]))
        by_level = torch.argsort(torch.cat([r.index for r in level_leaf_id]))
        leaf_level_perm = Rows.of(by_level)
        if leaf_level_perm.start == 0:
            leaf_level_perm = None

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
        blocks, block_back, split_sizes = cls._make_blocks(family_start, family_size, n, n0)
        return cls(
            num_nodes=n,
            num_leaves=leaf_nodes.numel(),
            order=order,
            rank=rank,
            level_ptr=level_ptr,
            parent_local=parent_local,
            leaf_node=leaf_nodes,
            leaf_pos=Rows.of(leaf_pos),
            level_leaf_local=level_leaf_local,
            level_leaf_id=level_leaf_id,
            leaf_level_perm=leaf_level_perm,
            family_start=family_start,
            family_size=family_size,
            blocks=blocks,
            block_back=block_back,
            split_sizes=split_sizes,
        )

    @staticmethod
    def _make_blocks(family_start: Tensor, family_size: Tensor, n: int, n0: int):
        device = family_start.device
        num_families = family_size.numel()
        blocks = []
        in_run = torch.zeros(num_families, dtype=torch.bool, device=device)
        if num_families:
            new_run = torch.ones(num_families, dtype=torch.bool, device=device)
            new_run[1:] = family_size[1:] != family_size[:-1]
            run_id = torch.cumsum(new_run, 0) - 1
            run_len = torch.bincount(run_id)
            in_run = run_len[run_id] >= MIN_RUN
            firsts = (new_run & in_run).nonzero().view(-1)
            for first, length in zip(
                firsts.tolist(), run_len[run_id[firsts]].tolist(), strict=True
            ):
                width = int(family_size[first])
                blocks.append(FamilyBlock(width, length, start=int(family_start[first])))
        rest = (~in_run).nonzero().view(-1)
        if rest.numel():
            sizes, inverse = family_size[rest].unique(return_inverse=True)
            widths = torch.tensor([bucket_width(int(s)) for s in sizes.tolist()], dtype=torch.long)
            fam_width = widths.to(device)[inverse]
            for w in widths.unique().tolist():
                fams = rest[fam_width == w]
                local = torch.arange(w, device=device)
                start, size = family_start[fams], family_size[fams]
                valid = local < size[:, None]
                index = start[:, None] + torch.where(valid, local, 0)
                blocks.append(FamilyBlock(w, fams.numel(), index=index, valid=valid))
        back = torch.empty(n - n0, dtype=torch.long, device=device)
        offset = 0
        for block in blocks:
            positions = torch.arange(block.count * block.width, device=device) + offset
            if block.start is not None:
                back[block.start - n0 : block.start - n0 + positions.numel()] = positions
            else:
                flat_valid = block.valid.reshape(-1)
                back[block.index.reshape(-1)[flat_valid] - n0] = positions[flat_valid]
            offset += positions.numel()
        identity = offset == n - n0 and torch.equal(back, torch.arange(n - n0, device=device))
        split_sizes, cursor = [], 0
        for block in blocks:
            if block.start is not None:
                if block.start > cursor:
                    split_sizes.append(block.start - cursor)
                block.piece = len(split_sizes)
                split_sizes.append(block.count * block.width)
                cursor = block.start + block.count * block.width
        if cursor < n:
            split_sizes.append(n - cursor)
        return blocks, None if identity else back, split_sizes

    def family_members(self, x: Tensor) -> list[Tensor]:
        """For every block, its members' rows of ``x`` (``[N, ...]``, BFS order): ``[F, W, ...]``.

        Slice blocks are views of one ``split`` (so their gradients are
        joined by one concatenation); gather blocks use ``index_select``.
        """
        pieces = x.split(self.split_sizes)
        out = []
        for b in self.blocks:
            rows = pieces[b.piece] if b.start is not None else x.index_select(0, b.index.view(-1))
            out.append(rows.view(b.count, b.width, *x.shape[1:]))
        return out

    def leaves_of_levels(self, levels: list[Tensor]) -> Tensor:
        """Leaf rows, in leaf order, of per-level tensors ``levels[d]: [n_d, ...]``."""
        parts = []
        for level, local in zip(levels, self.level_leaf_local, strict=True):
            if local.numel() == level.size(0):
                parts.append(level)
            elif local.numel():
                parts.append(level.index_select(0, local))
        out = torch.cat(parts) if len(parts) > 1 else parts[0]
        return out if self.leaf_level_perm is None else self.leaf_level_perm.take(out)

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
            elif isinstance(value, Rows):
                value = Rows(value.index.to(device), value.start)
            elif isinstance(value, list) and value and isinstance(value[0], Tensor):
                value = [v.to(device) for v in value]
            elif isinstance(value, list) and value and isinstance(value[0], Rows):
                value = [Rows(r.index.to(device), r.start) for r in value]
            elif isinstance(value, list) and value and isinstance(value[0], FamilyBlock):
                value = [_block_to(b, device) for b in value]
            moved[f.name] = value
        return TreeIndex(**moved)


def _block_to(block: FamilyBlock, device) -> FamilyBlock:
    if block.index is None:
        return block
    return FamilyBlock(
        block.width, block.count, index=block.index.to(device), valid=block.valid.to(device)
    )
