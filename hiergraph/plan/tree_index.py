"""The structural plan of a forest that every hierarchical attention op shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, wraps
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hiergraph._runs import ramp, run_ptr
from hiergraph.plan._to_device import moved
from hiergraph.plan.costs import BLOCK_COST, SLICE_SAVING
from hiergraph.plan.depth import node_depth
from hiergraph.plan.family_order import family_order
from hiergraph.plan.padded_forest import PaddedForest
from hiergraph.plan.validation import validate_structure

if TYPE_CHECKING:
    from hiergraph.plan.causal_plan import CausalPlan


def outside_inference_mode(build):
    """``build``, run outside ``torch.inference_mode()``: a plan, or a part of it built on
    first use, that an evaluation under inference mode asked for first then serves training
    too (inference tensors cannot be saved for backward)."""

    @wraps(build)
    def outside(*args, **kwargs):
        if not torch.is_inference_mode_enabled():  # the usual case: no mode to leave
            return build(*args, **kwargs)
        with torch.inference_mode(False):
            return build(*args, **kwargs)

    return outside


@dataclass
class FamilyBlock:
    """``count`` families of (padded) width ``width`` of one level, run as one dense batch.

    Positions are local to the level. A *slice* block (``start`` set) holds
    ``count`` consecutive families of exactly ``width`` members at positions
    ``start .. start + count * width``: its members are a view, no gather. A
    *gather* block (``index`` set) lists the members' positions ``[count,
    width]``; where ``valid`` is false the slot is padding and repeats the
    family's first member (it is masked as a query and as a key); ``padding`` ``[count]``
    counts those slots per family. ``parents`` ``[count]`` are the families' parents, local
    to the previous level. ``offset``: a gather block's first slot among its level's gather
    slots (:attr:`Level.gather_src`).
    """

    width: int
    count: int
    parents: Tensor
    start: int | None = None
    index: Tensor | None = None
    valid: Tensor | None = None
    offset: int = 0
    padding: Tensor | None = None

    @property
    def slot_cost(self) -> float:
        """What the block's slots cost the block kernel, in gather slots
        (:mod:`hiergraph.plan.costs`; its fixed cost not included)."""
        slots = self.count * self.width
        return slots if self.start is None else slots * (1 - SLICE_SAVING)

    def rows(self, x: Tensor) -> Tensor:
        """The members' rows of ``x`` (``[n_level, ...]``) as ``[count, width, ...]``."""
        if self.start is not None:
            rows = x.narrow(0, self.start, self.count * self.width)
        else:
            rows = x.index_select(0, self.index.view(-1))
        return rows.reshape(self.count, self.width, *x.shape[1:])

    def slots(self, x: Tensor | None, gathered: Tensor | None) -> Tensor:
        """The block's ``[count, width, ...]`` slots: of a slice block, rows of the level's
        ``x`` (``[n_level, ...]``); of a gather block, rows of the level's ``gathered``
        slots (:meth:`Level.gather`, :meth:`Level.result_buffers`). A view where the rows
        are contiguous."""
        if self.start is not None:
            rows = x.narrow(0, self.start, self.count * self.width)
        else:
            rows = gathered.narrow(0, self.offset, self.count * self.width)
        return rows.reshape(self.count, self.width, *rows.shape[1:])

    def to(self, device) -> FamilyBlock:
        return moved(self, device)


@dataclass
class Level:
    """One depth level of a :class:`TreeIndex` (all positions are local to the level).

    Attributes (``n`` nodes on the level):
        start: BFS position of the level's first node.
        parent_local: ``[n]`` index of each node's parent in the previous
            level (sorted: the level is grouped by parent); empty for level 0.
        num_children: ``[n]`` number of children of each node (0 for leaves);
            the children of node ``i`` are a contiguous run of the next level.
        leaf_local: positions of the leaves on this level.
        leaf_id: their indices in leaf order.
        count: ``[n]`` number of leaves below each node.
        family_start, family_size: the families (children of one parent) of
            this level, as local contiguous runs.
        blocks: the families cut into :class:`FamilyBlock` s for the dense
            kernel: a whole level of one family size, or a run of consecutive
            families of one size whose slots save more than a block costs, is a slice
            block; the rest are padded into gather blocks whose widths
            :func:`padded_widths` chooses (:mod:`hiergraph.plan.costs`).
        gather_src: the level's row of every slot of the gather blocks, block after
            block (padding repeats its family's first member): the block kernel reads them
            with one gather per level (:meth:`gather`); ``None`` without gather blocks.
        node_slot: on a level of gather blocks only, every node's gather slot: the
            results are read back with one gather (:meth:`results`).
        gather_slots, gather_rows: on a level with slice blocks too, the gather slots
            that hold a member, and the member's row: their results are written into the
            rows the slice blocks wrote (:meth:`results`).
        fanout: the number of children when every node of the level has the same number,
            else ``None`` (read when the plan is built, so that a compiled forward over a
            fresh plan reads no tensor on the host).
    """

    start: int
    parent_local: Tensor
    num_children: Tensor
    leaf_local: Tensor
    leaf_id: Tensor
    count: Tensor
    family_start: Tensor
    family_size: Tensor
    blocks: list[FamilyBlock] = field(default_factory=list)
    gather_src: Tensor | None = None
    node_slot: Tensor | None = None
    gather_slots: Tensor | None = None
    gather_rows: Tensor | None = None
    fanout: int | None = None

    @property
    def size(self) -> int:
        return self.num_children.numel()

    @property
    def all_leaves(self) -> bool:
        return self.leaf_local.numel() == self.size

    def gather(self, x: Tensor | None) -> Tensor | None:
        """The gather blocks' slots of the level's rows ``x`` (``[n, ...]``), block after
        block: ``[G, ...]`` (``None`` without gather blocks or ``x``)."""
        if x is None or self.gather_src is None:
            return None
        return x.index_select(0, self.gather_src)

    def result_buffers(self, like: Tensor, shape: tuple) -> tuple[Tensor | None, ...]:
        """Empty buffers for a result of shape ``[n, *shape]`` written block by block: the
        level's rows if it has slice blocks, and the gather slots ``[G, *shape]`` if it has
        gather blocks (``None`` where it has none); in ``like``'s dtype and device."""
        has_slices = self.node_slot is None
        rows = like.new_empty(self.size, *shape) if has_slices else None
        slots = None if self.gather_src is None else like.new_empty(len(self.gather_src), *shape)
        return rows, slots

    def results(self, rows: Tensor | None, slots: Tensor | None) -> Tensor:
        """The ``[n, ...]`` result from the :meth:`result_buffers` the blocks wrote."""
        if slots is None:
            return rows
        if rows is None:
            return slots.index_select(0, self.node_slot)
        return rows.index_put_((self.gather_rows,), slots.index_select(0, self.gather_slots))

    @cached_property
    @outside_inference_mode
    def sibling_pairs(self) -> Tensor:
        """``[2, S]`` local positions ``(query, key)`` of all ordered pairs of distinct siblings."""
        return _pairs(self.family_start, self.family_size)

    def to(self, device) -> Level:
        return moved(self, device)


@dataclass
class TreeIndex:
    r"""Breadth-first layout of a forest of signal hierarchies.

    Nodes are laid out in breadth-first (BFS) order: depth level by depth
    level, and inside a level grouped by parent (in the parent's BFS order)
    and then by ``slot``. In this order every *level* is a contiguous range
    ``level_ptr[d]:level_ptr[d+1]`` and every *family* (the children of one
    node) is a contiguous run sorted by child order, so the passes of HSA are
    segment sums and broadcasts between neighbouring levels, and families
    are cut into dense ``[F, b, ·]`` blocks without sorting.

    Build it with :meth:`from_hierarchy` (or ``hierarchy.tree_index()``,
    which caches it); it depends on the structure only and is reused by
    every layer and head.

    Shapes: ``N`` nodes, ``L`` leaves, ``D`` depth levels.

    Attributes:
        order: ``[N]`` node id at each BFS position.
        rank: ``[N]`` BFS position of each node id (inverse of ``order``).
        level_ptr: ``D + 1`` Python ints.
        leaf_node: ``[L]`` node id of each leaf, in leaf order.
        family_start, family_size: ``[F]`` BFS start and size of each family.
        parent_position: ``[N]`` BFS position of the parent of each BFS position (roots:
            their own position).
        levels: the per-level plan (:class:`Level`).
        leaves_by_level: ``[L]`` the leaves listed level by level (in-level order), as
            leaf ids; ``None`` when that is the leaf order.
        leaf_perm: ``[L]`` its inverse: every leaf's position in that listing; ``None``
            with ``leaves_by_level``.
        uniform: ``(B, b_1, …, b_D)`` when the forest has equal fanout: ``B`` trees,
            every node of depth ``d - 1`` has ``b_d >= 2`` children, all leaves are on
            the last level and in breadth-first order; else ``None``. Such plans run
            as reshaped views (:mod:`hiergraph.ops.hsa.uniform`).
        padded: when the forest has no equal fanout, its embedding in an equal-fanout
            forest (:class:`~hiergraph.plan.padded_forest.PaddedForest`) unless that needs
            too much padding, else ``None``; the reshaped views run on it where it is
            expected to be cheaper than the block kernel, and where the device allows its
            padding (:meth:`padded_on`).
    """

    num_nodes: int
    num_leaves: int
    order: Tensor
    rank: Tensor
    level_ptr: list[int]
    leaf_node: Tensor
    family_start: Tensor
    family_size: Tensor
    parent_position: Tensor
    levels: list[Level]
    leaf_perm: Tensor | None
    leaves_by_level: Tensor | None
    uniform: tuple[int, ...] | None = None
    padded: PaddedForest | None = None

    @property
    def num_levels(self) -> int:
        return len(self.level_ptr) - 1

    @property
    def parent_local(self) -> list[Tensor]:
        """Per level ``d``, ``[n_d]`` the index of each node's parent inside level ``d - 1``
        (``parent_local[0]`` is empty): the levels' :attr:`Level.parent_local`."""
        return [level.parent_local for level in self.levels]

    @property
    def level_sizes(self) -> list[int]:
        """Number of nodes on each level."""
        return [hi - lo for lo, hi in zip(self.level_ptr[:-1], self.level_ptr[1:], strict=True)]

    @property
    def device(self) -> torch.device:
        return self.order.device

    def block_pairs(self, min_width: int) -> int:
        """The (query, key) slot pairs of the :class:`FamilyBlock` s of at least ``min_width``
        members, on every level: the sum of ``count * width**2``."""
        blocks = [block for level in self.levels for block in level.blocks]
        return sum([b.count * b.width**2 for b in blocks if b.width >= min_width])

    @cached_property
    @outside_inference_mode
    def causal_plan(self) -> CausalPlan:
        """The forest's :class:`~hiergraph.plan.CausalPlan` (root paths, prefix counts, left
        siblings), built from this plan on first use and cached with it."""
        from hiergraph.plan.causal_plan import CausalPlan  # a view of this class

        return CausalPlan.from_tree_index(self)

    @classmethod
    def of(cls, hierarchy) -> TreeIndex:
        """``hierarchy`` itself if it is an index, the index a
        :class:`~hiergraph.plan.CausalPlan` is a view of, or the cached index of a
        :class:`~hiergraph.data.SignalHierarchy` or a batch of them
        (``hierarchy.tree_index()``)."""
        if isinstance(hierarchy, TreeIndex):
            return hierarchy
        index = getattr(hierarchy, "tree_index", None)
        if isinstance(index, TreeIndex):  # a CausalPlan's
            return index
        if callable(index):
            return index()
        raise TypeError(
            "hierarchy must be a SignalHierarchy, a batch of them, a TreeIndex or a "
            f"CausalPlan, got {type(hierarchy).__name__}"
        )

    @classmethod
    def from_hierarchy(cls, hierarchy, *, validate: bool = True) -> TreeIndex:
        """Plan for a :class:`~hiergraph.data.SignalHierarchy` or a batch of them (its
        structure checked as :meth:`from_parent` checks it)."""
        parent, slot, is_leaf = hierarchy.parent, hierarchy.slot, hierarchy.is_leaf
        return cls.from_parent(parent, slot, is_leaf, validate=validate)

    @classmethod
    @outside_inference_mode
    def from_parent(
        cls, parent: Tensor, slot: Tensor, is_leaf: Tensor, *, validate: bool = True
    ) -> TreeIndex:
        """Plan from ``[N]`` ``parent`` (roots point at themselves), ``slot`` and ``is_leaf``.

        With ``validate`` (the default) the structure is checked first
        (:func:`~hiergraph.data.validate_structure`; siblings may share a slot, kept in node
        order): a wrong one raised deep inside, or planned a forest that is none.
        :meth:`~hiergraph.data.SignalHierarchy.tree_index` checks once and passes ``False``.
        """
        depth = None
        if validate:
            depth = validate_structure(parent, slot, is_leaf, distinct_slots=False)
        device, n = parent.device, parent.numel()
        order, rank, level_ptr = _breadth_first(parent, slot, depth)
        parent_pos = rank[parent[order]]  # BFS position of each position's parent
        leaf_nodes = torch.arange(n, device=device)[is_leaf]
        leaf_pos = rank[leaf_nodes]
        leaf_id_at = torch.full((n,), -1, dtype=torch.long, device=device)
        leaf_id_at[leaf_pos] = torch.arange(leaf_nodes.numel(), device=device)
        family_start, family_size = _families(parent_pos, level_ptr)
        levels = _levels(parent_pos, level_ptr, leaf_id_at, family_start, family_size)
        leaf_ids = [level.leaf_id for level in levels]
        leaf_ids = torch.cat(leaf_ids) if leaf_ids else leaf_pos.new_empty(0)
        in_order = torch.equal(leaf_ids, torch.arange(leaf_ids.numel(), device=device))
        index = cls(
            num_nodes=n,
            num_leaves=leaf_nodes.numel(),
            order=order,
            rank=rank,
            level_ptr=level_ptr,
            leaf_node=leaf_nodes,
            family_start=family_start,
            family_size=family_size,
            parent_position=parent_pos,
            levels=levels,
            leaf_perm=None if in_order else torch.argsort(leaf_ids),
            leaves_by_level=None if in_order else leaf_ids,
        )
        index.uniform = index._uniform_shape()
        if index.uniform is None:
            index.padded = PaddedForest.from_tree_index(index)
        return index

    def padded_on(self, device: torch.device, extended: bool = True) -> PaddedForest | None:
        """:attr:`padded` where HSA on ``device`` may run on it
        (:meth:`~hiergraph.plan.padded_forest.PaddedForest.runs_on`: with ``extended``, more
        padding off the CPU, where the alternative is the launch-bound block kernel), else
        ``None``."""
        padded = self.padded
        return padded if padded is not None and padded.runs_on(device, extended) else None

    def _uniform_shape(self) -> tuple[int, ...] | None:
        """The ``uniform`` attribute, read off the levels (reads their tensors on the host)."""
        levels = self.levels
        if len(levels) < 2 or self.leaf_perm is not None or not levels[-1].all_leaves:
            return None
        fanout = []
        for level in levels[:-1]:
            if level.leaf_local.numel() or level.fanout is None or level.fanout < 2:
                return None
            fanout.append(level.fanout)
        return (levels[0].size, *fanout)

    @cached_property
    @outside_inference_mode
    def node_tree(self) -> Tensor:
        """``[N]`` tree id of every node: the rank of its root among the roots, in node order
        (for a PyG batch, the same as its ``batch`` vector)."""
        tree = torch.arange(self.level_ptr[1] if self.num_nodes else 0, device=self.device)
        per_level = [tree]
        for parent_local in self.parent_local[1:]:  # each level inherits its parents' ids
            tree = tree.index_select(0, parent_local)
            per_level.append(tree)
        return torch.cat(per_level).index_select(0, self.rank)

    @cached_property
    @outside_inference_mode
    def leaf_order_tree(self) -> Tensor:
        """``[N]`` tree id of every node, the trees numbered in leaf order (tree ``t`` holds
        the first leaf that no tree before it holds), in node order."""
        trees = self.level_ptr[1] - self.level_ptr[0]  # level 0 holds the roots
        leaf_tree = self.node_tree.index_select(0, self.leaf_node)
        leaves = torch.arange(leaf_tree.numel(), device=leaf_tree.device)
        first = leaves.new_full((trees,), leaf_tree.numel())
        first.scatter_reduce_(0, leaf_tree, leaves, "amin")  # every tree has a leaf
        rank = torch.empty_like(first)
        rank[first.argsort()] = torch.arange(trees, device=first.device)
        return rank.index_select(0, self.node_tree)

    @cached_property
    @outside_inference_mode
    def child_ptr(self) -> Tensor:
        """``[N + 1]`` the children of BFS position ``x`` are the positions ``child_ptr[x] ..
        child_ptr[x + 1] - 1`` (its family, in child order; none for a leaf)."""
        num_children = torch.cat([level.num_children for level in self.levels])
        ptr = torch.cumsum(num_children, 0) + self.level_ptr[1]
        return torch.cat([ptr.new_tensor([self.level_ptr[1]]), ptr])

    @cached_property
    @outside_inference_mode
    def leaf_row(self) -> Tensor:
        """``[N]`` the leaf id (the row of a leaf tensor) of every BFS position, ``-1`` at the
        inner nodes."""
        rows = torch.full((self.num_nodes,), -1, dtype=torch.long, device=self.device)
        leaves = torch.arange(self.num_leaves, device=self.device)
        return rows.index_copy_(0, self.rank.index_select(0, self.leaf_node), leaves)

    @cached_property
    @outside_inference_mode
    def tree_ptr(self) -> Tensor:
        """``[D, T + 1]`` the nodes of tree ``t`` (of ``T``, the roots' order) on level ``d``
        are the BFS positions ``tree_ptr[d, t] .. tree_ptr[d, t + 1] - 1`` (every level
        lists its nodes tree by tree)."""
        trees = self.level_ptr[1] if self.num_nodes else 0
        tree = self.node_tree.index_select(0, self.order)  # in BFS order
        bounds = torch.arange(trees + 1, device=self.device)
        per_level = [
            torch.searchsorted(tree[lo:hi], bounds) + lo
            for lo, hi in zip(self.level_ptr[:-1], self.level_ptr[1:], strict=True)
        ]
        return torch.stack(per_level) if per_level else bounds.new_zeros(0, trees + 1)

    @cached_property
    @outside_inference_mode
    def pair_ptr(self) -> Tensor:
        """``[N + 1]`` where the ``b^2`` ordered pairs of members of position ``x``'s family
        (its ``b`` children) begin in a list of every family's pairs, family after family."""
        pairs = (self.child_ptr[1:] - self.child_ptr[:-1]) ** 2
        return run_ptr(pairs)

    @cached_property
    @outside_inference_mode
    def sibling_pairs(self) -> Tensor:
        """``[2, S]`` BFS positions ``(query, key)`` of every ordered pair of distinct siblings.

        ``S = sum_f b_f (b_f - 1)``; pairs are grouped by query, keys in child order.
        """
        return _pairs(self.family_start, self.family_size)

    @outside_inference_mode
    def to(self, device) -> TreeIndex:
        """A copy with every tensor moved to ``device`` (and the causal plan, if built)."""
        index = moved(self, device)
        if "causal_plan" in self.__dict__:  # built: move it along instead of rebuilding it there
            index.causal_plan = self.causal_plan.to(device, index)
        return index


def _fanout(num_children: Tensor) -> int | None:
    """The number of children of every node of a level, when they all have the same number
    (else ``None``); one host read."""
    if not num_children.numel():
        return None
    low, high = torch.stack(torch.aminmax(num_children)).tolist()
    return low if low == high else None


def _pairs(family_start: Tensor, family_size: Tensor) -> Tensor:
    """All ordered pairs of distinct members of every family, grouped by query."""
    member_size = family_size.repeat_interleave(family_size)
    member_start = family_start.repeat_interleave(family_size)
    member_pos = member_start + ramp(family_size)
    query = member_pos.repeat_interleave(member_size)
    key = member_start.repeat_interleave(member_size) + ramp(member_size)
    keep = query != key
    return torch.stack([query[keep], key[keep]])


def _gather_slots(blocks: list[FamilyBlock], size: int) -> dict:
    """A level's :attr:`Level.gather_src` and how results come back (``node_slot`` on a
    level of gather blocks only, else ``gather_slots`` and ``gather_rows``)."""
    gathers = [b for b in blocks if b.start is None]  # in offset order
    if not gathers:
        return {}
    src = torch.cat([b.index.view(-1) for b in gathers])
    slots = torch.cat([b.valid.view(-1) for b in gathers]).nonzero().view(-1)
    rows = src.index_select(0, slots)
    if len(gathers) == len(blocks):  # every node has a gather slot
        node_slot = torch.empty(size, dtype=torch.long, device=src.device)
        return dict(gather_src=src, node_slot=node_slot.index_copy_(0, rows, slots))
    return dict(gather_src=src, gather_slots=slots, gather_rows=rows)


def padded_widths(sizes: list[int], counts: list[int]) -> list[int]:
    """The padded width of each family size in ``sizes`` (ascending, distinct; ``counts``
    families each) in the gather blocks of one level.

    The sizes are cut into runs of consecutive sizes, each one gather block as wide as its
    largest size, at the least cost :data:`~hiergraph.plan.costs.BLOCK_COST` per block
    plus one per slot (a dynamic program over the cut points): a few families are
    cheaper padded a little wider than run on their own, many keep their width."""
    best, cut = [0.0] + [float("inf")] * len(sizes), [0] * (len(sizes) + 1)
    for last in range(1, len(sizes) + 1):
        families = 0
        for first in range(last, 0, -1):  # the block of sizes[first - 1 : last]
            families += counts[first - 1]
            cost = best[first - 1] + BLOCK_COST + sizes[last - 1] * families
            if cost < best[last]:
                best[last], cut[last] = cost, first - 1
    widths, last = [0] * len(sizes), len(sizes)
    while last:
        first = cut[last]
        widths[first:last] = [sizes[last - 1]] * (last - first)
        last = first
    return widths


def _make_blocks(
    family_start: Tensor, family_size: Tensor, parent_local: Tensor
) -> list[FamilyBlock]:
    """Cut one level's families into slice blocks (long runs of equal size) and gather
    blocks (:func:`padded_widths`)."""
    device = family_start.device
    num_families = family_size.numel()
    if not num_families:
        return []
    blocks = []
    new_run = torch.ones(num_families, dtype=torch.bool, device=device)
    new_run[1:] = family_size[1:] != family_size[:-1]
    run_id = torch.cumsum(new_run, 0) - 1
    run_len = torch.bincount(run_id)
    # a run of one size becomes a slice block if it saves more than a block costs, or if
    # it is the whole level
    run_slots = run_len * family_size[new_run]
    in_run = (run_slots[run_id] * SLICE_SAVING >= BLOCK_COST) | (run_len.numel() == 1)
    firsts = (new_run & in_run).nonzero().view(-1)
    for first, length in zip(firsts.tolist(), run_len[run_id[firsts]].tolist(), strict=True):
        width, start = int(family_size[first]), int(family_start[first])
        parents = parent_local[family_start[first : first + length]]
        blocks.append(FamilyBlock(width, length, parents, start=start))
    rest = (~in_run).nonzero().view(-1)
    if rest.numel():
        sizes, inverse, counts = family_size[rest].unique(return_inverse=True, return_counts=True)
        widths = padded_widths(sizes.tolist(), counts.tolist())
        fam_width = torch.tensor(widths, dtype=torch.long, device=device)[inverse]
        offset = 0  # the gather blocks' slots, block after block
        for w in sorted(set(widths)):
            fams = rest[fam_width == w]
            local = torch.arange(w, device=device)
            start, size = family_start[fams], family_size[fams]
            valid = local < size[:, None]
            index = start[:, None] + torch.where(valid, local, 0)
            parents = parent_local[start]
            block = FamilyBlock(
                w,
                fams.numel(),
                parents,
                index=index,
                valid=valid,
                offset=offset,
                padding=(~valid).sum(1),
            )
            blocks.append(block)
            offset += block.count * block.width
    return blocks


def _breadth_first(
    parent: Tensor, slot: Tensor, depth: Tensor | None = None
) -> tuple[Tensor, Tensor, list[int]]:
    """The breadth-first order of a forest, level by level, each level sorted by (parent's
    rank, slot): ``order`` (node at each position), ``rank`` (position of each node) and
    ``level_ptr`` (where each level starts, and the end).

    The nodes are grouped by depth once (``depth`` as validation found it, else
    :func:`~hiergraph.plan.depth.node_depth`), so a level costs its own nodes, not the ones
    below it (a chain of depth ``D`` was :math:`O(N D)`).

    Raises:
        ValueError: if some nodes never reach a root (a cycle).
    """
    n = parent.numel()
    if depth is None:
        depth, reaches = node_depth(parent)
        if not bool(reaches.all()):
            raise ValueError("parent does not describe a forest: some nodes never reach a root")
    depth = depth.to(parent.device)
    by_depth = depth.argsort(stable=True)  # node order within a level, as family_order keeps
    level_ptr = [0, *torch.bincount(depth).cumsum(0).tolist()] if n else [0]
    rank = torch.empty_like(parent, dtype=torch.long)  # (parent may be int32)
    order = by_depth.clone()
    for lo, hi in zip(level_ptr[:-1], level_ptr[1:], strict=True):
        level = by_depth[lo:hi]
        if lo:  # below the roots: by parent's rank (set on the level above), then slot
            level = level.index_select(0, family_order(rank[parent[level]], slot[level]))
            order[lo:hi] = level
        rank[level] = torch.arange(lo, hi, device=parent.device)
    return order, rank, level_ptr


def _families(parent_pos: Tensor, level_ptr: list[int]) -> tuple[Tensor, Tensor]:
    """The families (contiguous runs of equal parent among the non-root positions): where
    each starts (a breadth-first position) and its size."""
    n = parent_pos.numel()
    n0 = level_ptr[1] if len(level_ptr) > 1 else n
    fam_parent = parent_pos[n0:]
    is_start = torch.ones_like(fam_parent, dtype=torch.bool)
    is_start[1:] = fam_parent[1:] != fam_parent[:-1]
    family_start = is_start.nonzero().view(-1) + n0
    return family_start, torch.diff(family_start, append=family_start.new_tensor([n]))


def _levels(
    parent_pos: Tensor,
    level_ptr: list[int],
    leaf_id_at: Tensor,
    family_start: Tensor,
    family_size: Tensor,
) -> list[Level]:
    """The :class:`Level` of every depth, from the breadth-first parents ``parent_pos`` and
    leaf ids ``leaf_id_at`` (-1 for internal nodes) of the positions, and the families;
    the children and the leaves below every node are counted here."""
    n, depths = parent_pos.numel(), len(level_ptr) - 1
    num_children = torch.bincount(parent_pos[level_ptr[1] if n else 0 :], minlength=n)
    count = (leaf_id_at >= 0).long()
    for d in range(depths - 1, 0, -1):  # leaves below every node, deepest level first
        lo, hi, up = level_ptr[d], level_ptr[d + 1], level_ptr[d - 1]
        below = torch.bincount(
            parent_pos[lo:hi] - up, weights=count[lo:hi].double(), minlength=lo - up
        )
        count[up:lo] += below.long()  # (the level above: a level's cost is its own size)
    family_ptr = torch.searchsorted(family_start, family_start.new_tensor(level_ptr)).tolist()
    levels = []
    for d in range(depths):
        lo, hi = level_ptr[d], level_ptr[d + 1]
        pl = parent_pos[lo:hi] - level_ptr[d - 1] if d else parent_pos.new_empty(0)
        families = slice(family_ptr[d], family_ptr[d + 1])
        f_start, f_size = family_start[families] - lo, family_size[families]
        ids = leaf_id_at[lo:hi]
        local = (ids >= 0).nonzero().view(-1)
        blocks = _make_blocks(f_start, f_size, pl)
        levels.append(
            Level(
                start=lo,
                parent_local=pl,
                num_children=num_children[lo:hi],
                leaf_local=local,
                leaf_id=ids[local],
                count=count[lo:hi],
                family_start=f_start,
                family_size=f_size,
                blocks=blocks,
                **_gather_slots(blocks, hi - lo),
                fanout=_fanout(num_children[lo:hi]),
            )
        )
    return levels
