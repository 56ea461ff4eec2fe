"""The structure strictly causal HSA reads: root paths, prefix counts and left siblings."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from hiergraph._deprecation import renamed_attribute
from hiergraph._runs import run_ptr
from hiergraph.plan._inference_mode import outside_inference_mode
from hiergraph.plan._to_device import moved
from hiergraph.plan.tree_index import TreeIndex


@dataclass
class CausalPlan:
    r"""Structure of a forest for causal HSA: root paths, prefix counts and left siblings.

    Leaves are taken in *leaf order* (increasing node id, as everywhere in
    hiergraph); this order must be a depth-first order of the forest: the
    leaves of every node are consecutive and sibling sub-trees follow their
    ``slot`` order (what :func:`~hiergraph.data.from_nested` gives when the leaf
    ints are numbered in reading order). Depth ``s`` runs from 0 (roots) to
    ``D``.

    Shapes: ``L`` leaves, ``N`` nodes; per depth ``s = 0 .. D``, the ``P_s`` leaves
    at depth ``>= s`` (``P_0 = L``) and the ``n_s`` nodes at depth ``s``. The
    attributes ``pair_*``, ``last_pair``, ``depth_nodes`` and ``key_*`` are lists of
    ``D + 1`` tensors, entry ``s`` for depth ``s``; their shapes below are those of
    entry ``s``.

    Attributes:
        num_nodes: the number of nodes ``N``.
        num_leaves: the number of leaves ``L``.
        max_depth: the largest depth ``D``.
        leaf_node: ``[L]`` node id of each leaf.
        leaf_depth: ``[L]`` depth of each leaf.
        ancestors: ``[L, D + 1]`` node id of the depth-``s`` ancestor of each
            leaf (``-1`` below the leaf).
        first_leaf: ``[N]`` first leaf (leaf order) below each node.
        last_leaf: ``[N]`` last leaf (leaf order) below each node.
        count: ``[N]`` number of leaves below each node.
        sibling_rank: ``[N]`` number of left siblings of each node (its place among
            its siblings; 0 for roots); not ``TreeIndex.rank``, a node's breadth-first
            position. (``rank``, its old name, works with a ``FutureWarning`` until 0.3.0.)
        anc_leaf: the leaf of every ``(leaf, ancestor)`` pair, one pair per entry
            ``>= 0`` of ``ancestors`` (row by row; the leaf itself included), for
            one-scatter node sums.
        anc_node: the ancestor of every ``(leaf, ancestor)`` pair.
        pair_leaf: ``[P_s]`` leaves with depth ``>= s`` (ascending).
        pair_node: ``[P_s]`` their depth-``s`` ancestor :math:`A_s`.
        pair_count: ``[P_s]`` leaves of :math:`A_s` up to the pair's leaf.
        pair_is_leaf: ``[P_s]`` whether :math:`A_s` is the leaf itself.
        pair_child: ``[P_s]`` position of the same leaf among the depth
            ``s + 1`` pairs (0 where the pair is a leaf pair, and at depth ``D``).
        last_pair: ``[n_s]`` for each depth-``s`` node, its pair with its own last leaf.
        depth_nodes: ``[n_s]`` the nodes at depth ``s``.
        key_pair: ``[E_s]`` the pair (its position in ``pair_leaf[s]``) of every
            (pair, left sibling of the pair's node) edge (none at depth 0).
        key_node: ``[E_s]`` the left sibling of every such edge.
        sib_query: ``[S]`` the node of every (node, left sibling) edge of all non-root
            nodes.
        sib_key: ``[S]`` the left sibling of every such edge.
        tree_index: the forest's :class:`~hiergraph.plan.TreeIndex`, of which this plan is
            a view. When it has equal fanout (``tree_index.uniform``), strictly causal HSA
            runs as reshaped views (:mod:`hiergraph.ops.hsa.causal_uniform`).
    """

    num_nodes: int
    num_leaves: int
    max_depth: int
    leaf_node: Tensor
    leaf_depth: Tensor
    ancestors: Tensor
    first_leaf: Tensor
    last_leaf: Tensor
    count: Tensor
    sibling_rank: Tensor
    anc_leaf: Tensor
    anc_node: Tensor
    pair_leaf: list[Tensor]
    pair_node: list[Tensor]
    pair_count: list[Tensor]
    pair_is_leaf: list[Tensor]
    pair_child: list[Tensor]
    last_pair: list[Tensor]
    depth_nodes: list[Tensor]
    key_pair: list[Tensor]
    key_node: list[Tensor]
    sib_query: Tensor
    sib_key: Tensor
    tree_index: TreeIndex

    rank = renamed_attribute("sibling_rank", "TreeIndex.rank is a breadth-first position")

    @classmethod
    def of(cls, hierarchy) -> CausalPlan:
        """``hierarchy`` itself if it is a plan, else the cached plan of its
        :class:`~hiergraph.plan.TreeIndex` (:attr:`TreeIndex.causal_plan`; what
        :meth:`TreeIndex.of` takes, this takes)."""
        if isinstance(hierarchy, CausalPlan):
            return hierarchy
        return TreeIndex.of(hierarchy).causal_plan

    def to(self, device, tree_index: TreeIndex | None = None) -> CausalPlan:
        """A copy with every tensor on ``device`` (``tree_index``: the already moved index)."""
        return moved(self, device, tree_index=tree_index or self.tree_index.to(device))

    @cached_property
    @outside_inference_mode
    def breadth_first(self) -> tuple[Tensor, ...]:
        """The plan in the tree index's breadth-first positions, as the compiled causal
        kernel reads it: ``path [L, D + 1]`` (every leaf's ancestors, ``-1`` below the
        leaf), ``leaf_depth``, ``pair_ptr [L + 1]`` (the running sum of the leaf depths:
        where every leaf's (leaf, ancestor) pairs begin) and, per position, the first and
        last leaf, the leaf count, the rank among the siblings and the node id."""
        index = self.tree_index
        path = torch.where(
            self.ancestors >= 0, index.rank[self.ancestors.clamp(min=0)], self.ancestors
        )
        depth = self.leaf_depth
        pair_ptr = run_ptr(depth)
        per_node = (self.first_leaf, self.last_leaf, self.count, self.sibling_rank)
        nodes = [t.index_select(0, index.order) for t in per_node]
        return (path.contiguous(), depth, pair_ptr, *nodes, index.order)

    @classmethod
    def from_hierarchy(cls, hierarchy) -> CausalPlan:
        """A fresh (uncached) plan of a :class:`~hiergraph.data.SignalHierarchy` or a batch."""
        for name in ("parent", "slot", "is_leaf"):
            if getattr(hierarchy, name, None) is None:
                raise TypeError(
                    f"hierarchy has no '{name}' attribute; pass a SignalHierarchy (or a batch)"
                )
        return cls.from_tree_index(TreeIndex.from_hierarchy(hierarchy))

    @classmethod
    def from_tree_index(cls, index: TreeIndex) -> CausalPlan:
        """The causal view of a forest's :class:`~hiergraph.plan.TreeIndex`.

        Everything is read off the breadth-first plan (depths, parents, sibling
        ranks, leaf counts, leaf order); nothing is derived from ``parent`` again.
        Raises ``ValueError`` if the leaf order is not a depth-first order.
        """
        n, num_leaves = index.num_nodes, index.num_leaves
        max_depth = index.num_levels - 1 if n else 0
        depth, parent, count = _node_tables(index)
        leaf_node = index.leaf_node
        leaf_depth = depth[leaf_node]
        ancestors, anc_leaf, anc_node, first_leaf, last_leaf = _leaf_paths(
            leaf_node, depth, parent, max_depth
        )
        families = _Families(index)
        families.check_depth_first(first_leaf, last_leaf, count)
        row, sib_key = families.left_siblings(families.child)
        sib_query = families.child[row]
        pairs = _depth_pairs(
            ancestors, leaf_depth, first_leaf, last_leaf, depth, max_depth, families
        )
        return cls(
            num_nodes=n,
            num_leaves=num_leaves,
            max_depth=max_depth,
            leaf_node=leaf_node,
            leaf_depth=leaf_depth,
            ancestors=ancestors,
            first_leaf=first_leaf,
            last_leaf=last_leaf,
            count=count,
            sibling_rank=families.sibling_rank,
            anc_leaf=anc_leaf,
            anc_node=anc_node,
            **pairs,
            sib_query=sib_query,
            sib_key=sib_key,
            tree_index=index,
        )


def _node_tables(index: TreeIndex) -> tuple[Tensor, Tensor, Tensor]:
    """Per node (node order): its depth, parent and leaf count, read off the plan."""
    node_rank = index.rank
    sizes = torch.tensor(index.level_sizes, dtype=torch.long, device=index.device)  # ([]: float)
    depth = torch.arange(sizes.numel(), device=index.device).repeat_interleave(sizes)[node_rank]
    parent = index.order[index.parent_position][node_rank]
    counts = [level.count for level in index.levels]  # leaves below, level by level
    count = torch.cat(counts)[node_rank] if counts else node_rank.new_zeros(0)
    return depth, parent, count


def _leaf_paths(
    leaf_node: Tensor, depth: Tensor, parent: Tensor, max_depth: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Every leaf's root path, ``ancestors [L, max_depth + 1]`` (node at each depth, -1
    below the leaf), its (leaf, node) pairs ``anc_leaf, anc_node``, and every node's first
    and last leaf (``[n]``, node order)."""
    num_leaves, device, n = leaf_node.numel(), leaf_node.device, depth.numel()
    leaves = torch.arange(num_leaves, device=device)
    ancestors = torch.full((num_leaves, max_depth + 1), -1, dtype=torch.long, device=device)
    cur = leaf_node
    for _ in range(max_depth + 1):
        ancestors[leaves, depth[cur]] = cur
        cur = parent[cur]
    valid = ancestors >= 0
    anc_leaf = leaves[:, None].expand_as(ancestors)[valid]
    anc_node = ancestors[valid]
    first_leaf = torch.full((n,), num_leaves, dtype=torch.long, device=device)
    first_leaf = first_leaf.scatter_reduce(0, anc_node, anc_leaf, "amin")
    last_leaf = torch.full((n,), -1, dtype=torch.long, device=device)
    last_leaf = last_leaf.scatter_reduce(0, anc_node, anc_leaf, "amax")
    return ancestors, anc_leaf, anc_node, first_leaf, last_leaf


class _Families:
    """The forest's families: the non-root nodes in breadth-first order ``child``, grouped by
    parent in child order, and ``first``, whether each position of ``child`` starts a family;
    per node (node order; 0 for roots), its ``sibling_rank`` and the position
    ``start`` of its family's first member in ``child``."""

    def __init__(self, index: TreeIndex):
        n, device = index.num_nodes, index.device
        n0 = index.level_ptr[1] if n else 0
        self.child = index.order[n0:]
        fam_start = (index.family_start - n0).repeat_interleave(index.family_size)
        pos = torch.arange(self.child.numel(), device=device)
        self.first = pos == fam_start  # a family's first member
        self.sibling_rank = torch.zeros(n, dtype=torch.long, device=device)
        self.sibling_rank[self.child] = pos - fam_start
        self.start = torch.zeros(n, dtype=torch.long, device=device)
        self.start[self.child] = fam_start

    def check_depth_first(self, first_leaf: Tensor, last_leaf: Tensor, count: Tensor) -> None:
        """Raise ``ValueError`` unless the leaves of every node are consecutive and sibling
        sub-trees follow each other in slot order (a depth-first leaf order)."""
        child = self.child
        contiguous = bool((last_leaf - first_leaf + 1 == count).all())
        following = last_leaf[child[:-1]] + 1 == first_leaf[child[1:]]
        if not (contiguous and bool(following[~self.first[1:]].all())):
            raise ValueError(
                "causal attention needs the leaf order to be a depth-first order of the tree "
                "(the leaves of every node consecutive, sibling sub-trees in slot order); "
                "number the leaves left to right, e.g. from_nested([[0, 1], [2, 3, 4]])"
            )

    def left_siblings(self, query: Tensor) -> tuple[Tensor, Tensor]:
        """(row in ``query``, left sibling) for each left sibling of each node in ``query``."""
        r = self.sibling_rank[query]
        device = query.device
        row = torch.arange(query.numel(), device=device).repeat_interleave(r)
        offset = torch.arange(row.numel(), device=device) - (torch.cumsum(r, 0) - r)[row]
        return row, self.child[self.start[query][row] + offset]


def _depth_pairs(
    ancestors: Tensor,
    leaf_depth: Tensor,
    first_leaf: Tensor,
    last_leaf: Tensor,
    depth: Tensor,
    max_depth: int,
    families: _Families,
) -> dict[str, list[Tensor]]:
    """Per depth ``s``, the (leaf, ancestor at depth ``s``) pairs and their tables: the
    :class:`CausalPlan` fields ``pair_*``, ``last_pair``, ``depth_nodes``, ``key_*``."""
    names = ("pair_leaf", "pair_node", "pair_count", "pair_is_leaf", "pair_child", "last_pair",
             "depth_nodes", "key_pair", "key_node")  # fmt: skip
    out: dict[str, list[Tensor]] = {name: [] for name in names}
    for s in range(max_depth + 1):
        pl = (leaf_depth >= s).nonzero().view(-1)
        pn = ancestors[pl, s]
        out["pair_leaf"].append(pl)
        out["pair_node"].append(pn)
        out["pair_count"].append(pl - first_leaf[pn] + 1)
        out["pair_is_leaf"].append(leaf_depth[pl] == s)
        dn = (depth == s).nonzero().view(-1)
        out["depth_nodes"].append(dn)
        out["last_pair"].append(torch.searchsorted(pl, last_leaf[dn]))
        kp, kn = families.left_siblings(pn) if s > 0 else (pl[:0], pl[:0])
        out["key_pair"].append(kp)
        out["key_node"].append(kn)
    pair_leaf, pair_is_leaf = out["pair_leaf"], out["pair_is_leaf"]
    for s in range(max_depth + 1):
        if s < max_depth:
            nxt = pair_leaf[s + 1]
            ch = torch.searchsorted(nxt, pair_leaf[s]).clamp(max=max(nxt.numel() - 1, 0))
            out["pair_child"].append(torch.where(pair_is_leaf[s], 0, ch))
        else:
            out["pair_child"].append(torch.zeros_like(pair_leaf[s]))
    return out
