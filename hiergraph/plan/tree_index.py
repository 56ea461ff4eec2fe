"""The structural plan of a forest that every hierarchical attention op shares:
:class:`TreeIndex`, the forest's breadth-first layout, and how its order and families are
found. Its levels are :class:`~hiergraph.plan.level.Level` s
(:mod:`~hiergraph.plan.level`), cut into the block kernel's
:class:`~hiergraph.plan.family_block.FamilyBlock` s (:mod:`~hiergraph.plan.family_block`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hiergraph._runs import run_ptr
from hiergraph.plan._first_use import built_on_first_use
from hiergraph.plan._inference_mode import outside_inference_mode
from hiergraph.plan._to_device import moved
from hiergraph.plan.depth import node_depth
from hiergraph.plan.family_block import FamilyBlock, padded_widths
from hiergraph.plan.family_order import family_order
from hiergraph.plan.level import Level, make_levels, pairs
from hiergraph.plan.padded_forest import PaddedForest
from hiergraph.plan.validation import validate_structure

if TYPE_CHECKING:
    from hiergraph.plan.causal_plan import CausalPlan

# FamilyBlock, Level, outside_inference_mode and padded_widths live in the family_block, level
# and _inference_mode modules; they are importable from here as before.
__all__ = ["FamilyBlock", "Level", "TreeIndex", "outside_inference_mode", "padded_widths"]


def describe_non_hierarchy(value) -> str:
    """What ``value``, refused where a hierarchy was expected, is, and what to pass instead,
    for the values mistaken for one most often (a graph, an ``edge_index``, a batch vector,
    a list of trees); else its type's name."""
    from torch_geometric.data import Data

    name = type(value).__name__
    graph = isinstance(value, Data) and callable(getattr(value, "hierarchy", None))
    if graph and "tree_parent" in value:
        return f"{name} (a graph with its community tree: pass graph.hierarchy())"
    if isinstance(value, Tensor) and value.dim() == 2 and value.size(0) == 2:
        return (
            "a [2, E] tensor (an edge_index?): the trees cannot be read from it. Pass the "
            "hierarchy itself, layer(x, hierarchy) (a SignalHierarchy or a batch of them)"
        )
    if isinstance(value, Tensor):
        return (
            "a tensor (a batch vector?): the trees cannot be read from it. Pass the "
            "hierarchy itself; for PyG's pooling over leaves, leaf_batch(hierarchy) is the "
            "leaves' tree ids"
        )
    if isinstance(value, list | tuple):
        batched = "torch_geometric.data.Batch.from_data_list(...)"
        return f"a {name}: batch the hierarchies first, {batched}"
    if isinstance(value, Data):
        return (
            f"a {name} without a community tree or another tree (parent, slot, is_leaf): "
            "build one with hiergraph.data's from_nested, window_hierarchy or "
            "document_hierarchy, or, for a graph, apply hiergraph.transforms.GraphHierarchy()"
        )
    return name


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
        num_nodes: the number of nodes ``N``.
        num_leaves: the number of leaves ``L``.
        order: ``[N]`` node id at each BFS position.
        rank: ``[N]`` BFS position of each node id (inverse of ``order``).
        level_ptr: ``D + 1`` Python ints.
        leaf_node: ``[L]`` node id of each leaf, in leaf order.
        family_start: ``[F]`` BFS start of each family.
        family_size: ``[F]`` size of each family.
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

    The parts that only some paths read, :attr:`padded` and every level's family blocks
    (:attr:`Level.blocks`), are built on first use: the compiled CPU kernel reads neither.
    :meth:`complete` builds them now; :meth:`~hiergraph.data.SignalHierarchy.tree_index`,
    :class:`~hiergraph.loader.HierarchyLoader` and a move off the CPU (:meth:`to`) do, so
    that a compiled forward or a forward on an accelerator finds them built.
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

    def family_pairs(self, min_size: int) -> int:
        """The ordered (query, key) pairs of members of the families of at least
        ``min_size`` members: the sum of their sizes squared (one read on the host)."""
        size = self.family_size
        return int(size.square().mul(size >= min_size).sum())

    @built_on_first_use
    def padded(self) -> PaddedForest | None:
        """When the forest has no equal fanout, its embedding in an equal-fanout forest
        (:class:`~hiergraph.plan.padded_forest.PaddedForest`) unless that needs too much
        padding, else ``None``; the reshaped views run on it where it is expected to be
        cheaper than the block kernel, and where the device allows its padding
        (:meth:`padded_on`)."""
        return None if self.uniform is not None else PaddedForest.from_tree_index(self)

    def complete(self) -> TreeIndex:
        """Build the parts of the plan built on first use otherwise, :attr:`padded` and every
        level's family blocks (:meth:`Level.complete`), and return the plan."""
        for level in self.levels:
            level.complete()
        self.padded  # noqa: B018 (built and cached on first read)
        return self

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
        (``hierarchy.tree_index()``, where not built yet without the parts built on first
        use: the ops' path builds those it reads)."""
        if isinstance(hierarchy, TreeIndex):
            return hierarchy
        index = getattr(hierarchy, "tree_index", None)
        if isinstance(index, TreeIndex):  # a CausalPlan's
            return index
        if callable(getattr(hierarchy, "_lazy_tree_index", None)):
            return hierarchy._lazy_tree_index()
        raise TypeError(
            "hierarchy must be a SignalHierarchy, a batch of them, a TreeIndex or a "
            f"CausalPlan, got {describe_non_hierarchy(hierarchy)}"
        )

    @classmethod
    def from_hierarchy(
        cls, hierarchy, *, validate: bool = True, depth: Tensor | None = None
    ) -> TreeIndex:
        """Plan for a :class:`~hiergraph.data.SignalHierarchy` or a batch of them (its
        structure checked as :meth:`from_parent` checks it)."""
        parent, slot, is_leaf = hierarchy.parent, hierarchy.slot, hierarchy.is_leaf
        return cls.from_parent(parent, slot, is_leaf, validate=validate, depth=depth)

    @classmethod
    @outside_inference_mode
    def from_parent(
        cls,
        parent: Tensor,
        slot: Tensor,
        is_leaf: Tensor,
        *,
        validate: bool = True,
        depth: Tensor | None = None,
    ) -> TreeIndex:
        """Plan from ``[N]`` ``parent`` (roots point at themselves), ``slot`` and ``is_leaf``.

        With ``validate`` (the default) the structure is checked first
        (:func:`~hiergraph.data.validate_structure`; siblings may share a slot, kept in node
        order): a wrong one raised deep inside, or planned a forest that is none.
        :meth:`~hiergraph.data.SignalHierarchy.tree_index` checks once and passes ``False``,
        with the nodes' ``depth`` the check returned (else found here).
        """
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
        levels = make_levels(parent_pos, level_ptr, leaf_id_at, family_start, family_size)
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
        return pairs(self.family_start, self.family_size)

    @outside_inference_mode
    def to(self, device) -> TreeIndex:
        """A copy with every tensor moved to ``device``, with the parts built on first use
        that this plan has built (and the causal plan, if built). Off the CPU the copy holds
        every such part (:meth:`complete`, here first): built there, they would read the
        device's tensors on the host in the first forward."""
        if torch.device(device).type != "cpu":
            self.complete()
        index = moved(self, device, cached=("padded",))
        if "causal_plan" in self.__dict__:  # built: move it along instead of rebuilding it there
            index.causal_plan = self.causal_plan.to(device, index)
        return index


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
