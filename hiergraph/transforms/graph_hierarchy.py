"""Community hierarchies over the nodes of a graph (graph → signal hierarchy)."""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import networkx as nx
import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform

from hiergraph._checks import check_int, check_positive
from hiergraph._versions import guard_holds, version_guard
from hiergraph.data.domain import Domain
from hiergraph.data.graph_pe import laplacian_pe
from hiergraph.data.signal_hierarchy import SignalHierarchy
from hiergraph.ops.edge_index import check_edge_index
from hiergraph.plan.family_order import family_order
from hiergraph.transforms.graph_partition import label_propagation_tree

METHODS = ("louvain", "metis", "lp")

#: The tree attributes that :class:`GraphHierarchy` adds (all ``[T, ...]``, ``T`` tree nodes).
TREE_KEYS = ("parent", "slot", "is_leaf", "depth", "node_type", "domain", "pos", "graph_pe")


class HierarchicalGraph(Data):
    r"""A graph whose nodes are the leaves of a community tree.

    The graph attributes (``x``, ``edge_index``, ``y``, masks, …) are the
    original ones, untouched. The tree lives in ``tree_*`` attributes over its
    ``T = num_nodes + num_communities`` nodes, numbered as in
    :class:`~hiergraph.data.SignalHierarchy`: leaves first (tree node ``i`` is
    graph node ``i``), then the communities; ``tree_parent`` of the root is the
    root itself. PyG batching shifts ``tree_parent`` by ``T`` per graph, so a
    :class:`~torch_geometric.loader.DataLoader` over many small graphs yields a
    forest whose leaves are, in order, the nodes of the batched graph.

    :meth:`hierarchy` returns the tree (or forest) as a
    :class:`~hiergraph.data.SignalHierarchy`, the input of
    :class:`~hiergraph.nn.HierarchicalSelfAttention`.
    """

    def __inc__(self, key: str, value: Any, *args, **kwargs) -> Any:
        if key == "tree_parent":
            return value.numel()
        return super().__inc__(key, value, *args, **kwargs)

    def hierarchy(self) -> SignalHierarchy:
        """The community tree (a forest for a batch) as a ``SignalHierarchy``, cached until
        a ``tree_*`` attribute is replaced, added, removed or written in place."""
        if "tree_parent" not in self:
            raise ValueError("this graph has no community tree; apply GraphHierarchy() first")
        fields = {k: self[f"tree_{k}"] for k in TREE_KEYS if f"tree_{k}" in self}
        cached = self.__dict__.get("_hierarchy_cache")
        if cached is not None and cached[0] == tuple(fields):
            if guard_holds(cached[1], *fields.values()):
                return cached[2]
        parent = self.tree_parent
        nodes = torch.arange(parent.numel(), device=parent.device)
        child = nodes[parent != nodes]
        order = family_order(parent[child], self.tree_slot[child])
        tree = SignalHierarchy(
            edge_index=torch.stack([child[order], parent[child[order]]]), **fields
        )
        tree.num_nodes = parent.numel()
        guard = version_guard(*fields.values())  # None: inference tensors
        self.__dict__["_hierarchy_cache"] = None if guard is None else (tuple(fields), guard, tree)
        return tree

    def __setstate__(self, mapping: dict[str, Any]) -> None:
        # The cached tree is not taken from a pickle: a file read weights-only could pair
        # these tree_* attributes with any other tree (or object); hierarchy() rebuilds it.
        mapping = dict(mapping)
        mapping.pop("_hierarchy_cache", None)
        super().__setstate__(mapping)


class GraphHierarchy(BaseTransform):
    r"""Adds a community tree over a graph's nodes (Amizadeh et al., Sec. 2: a graph
    domain in a signal hierarchy, as the link structure of Fig. 1).

    The leaves of the tree are the graph nodes, in node order; internal nodes
    are communities, then communities of communities, up to one root. Each
    family (the children of one community) is a signal on a **graph** domain:
    its members are linked in the *quotient graph*, where two siblings
    :math:`A, B` are adjacent iff some graph edge :math:`(u, v)` has
    :math:`u \in A, v \in B`. Its position features are the Laplacian
    eigenvectors of that quotient graph
    (:func:`~hiergraph.data.laplacian_pe`), so siblings that are linked get
    similar embeddings and an HSA sibling bias
    :math:`\varepsilon(A)^\top\varepsilon(B)`.

    * ``method='louvain'``: the nested partitions of
      :func:`networkx.community.louvain_partitions` (finest first, at most
      ``levels`` of them), deterministic for a fixed ``seed``.
    * ``method='metis'``: METIS parts of about ``max_family`` nodes, grouped
      recursively (needs pymetis, the ``metis`` extra, or ``torch-sparse`` /
      ``pyg-lib`` with METIS).
    * ``method='lp'``: size-capped label propagation, coarsened level by
      level (:func:`~hiergraph.transforms.graph_partition.label_propagation_tree`);
      sorts and scatters only, for big graphs (1M nodes) where Louvain is
      too slow; deterministic for a fixed ``seed``.

    No family has more than ``max_family`` members: a larger one is split
    (Louvain on its quotient graph, or METIS, then small groups are packed
    together up to ``max_family``), adding tree levels where needed. A
    community with a single member is not a node of its own.

    The result is a :class:`HierarchicalGraph` with ``tree_*`` attributes
    (see there) and ``tree_graph_pe`` ``[T, pe_dim]``; ``edge_index`` and all
    other attributes are kept as they are. :func:`hierarchy_stats` reports the
    family sizes.

    Args:
        method: ``'louvain'``, ``'metis'`` or ``'lp'``.
        levels: at most this many Louvain levels (``None``: all; Louvain only).
        max_family: the largest number of children of a node (``>= 2``).
        resolution: Louvain resolution (larger: smaller communities).
        seed: Louvain / label-propagation / METIS (pymetis) seed.
        iterations: label-propagation rounds per level (``'lp'`` only).
        pe_dim: Laplacian eigenvectors per node (0: no ``tree_graph_pe``); a model that
            reads positions must be built for them (``graph_pe_dim=pe_dim``).
    """

    def __init__(
        self,
        method: str = "louvain",
        levels: int | None = None,
        max_family: int = 64,
        resolution: float = 1.0,
        seed: int = 0,
        pe_dim: int = 8,
        iterations: int = 10,
    ):
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if method == "metis":
            _require_metis()
        check_int(max_family, "max_family", minimum=2)
        check_int(levels, "levels", minimum=0, optional=True)
        check_int(pe_dim, "pe_dim", minimum=0)
        check_int(iterations, "iterations")
        check_int(seed, "seed", minimum=0)
        check_positive(resolution, "resolution")
        # as Python ints: NumPy's pass the checks, and networkx refuses a NumPy seed
        self.method, self.max_family = method, int(max_family)
        self.levels = None if levels is None else int(levels)
        self.resolution, self.seed, self.pe_dim = resolution, int(seed), int(pe_dim)
        self.iterations = int(iterations)

    def forward(self, data: Data) -> HierarchicalGraph:
        if data.edge_index is None or data.num_nodes is None:
            raise ValueError("GraphHierarchy needs a graph with edge_index and num_nodes")
        n = data.num_nodes
        if n == 0:  # (lp made a tree with a phantom leaf, louvain failed inside numpy)
            raise ValueError("GraphHierarchy needs a graph with at least one node, got 0")
        edge_index = data.edge_index.cpu()  # the tree is built on the host
        check_edge_index(edge_index, n)
        if self.method == "lp":
            parent = label_propagation_tree(
                n, edge_index, self.max_family, self.iterations, self.seed
            )
        else:
            parent = torch.tensor(_Builder(self, n, edge_index.numpy()).build())
        tree = SignalHierarchy.from_parent(
            parent, domain=torch.full((parent.numel(),), int(Domain.GRAPH))
        )
        out = HierarchicalGraph(**{k: v for k, v in data.items()})
        out.num_nodes = n
        for key in TREE_KEYS:
            if key != "graph_pe":  # (below, from the graph's edges)
                out[f"tree_{key}"] = tree[key]
        if self.pe_dim:
            out.tree_graph_pe = laplacian_pe(tree, sibling_edges(tree, edge_index), self.pe_dim)
        return out

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(method={self.method!r}, levels={self.levels}, "
            f"max_family={self.max_family}, seed={self.seed}, pe_dim={self.pe_dim})"
        )


def sibling_edges(tree: SignalHierarchy, edge_index: Tensor) -> Tensor:
    r"""Quotient-graph edges among siblings: for each graph edge :math:`(u, v)`,
    :math:`u \ne v`, the pair of children of their lowest common ancestor that
    contain :math:`u` and :math:`v` (deduplicated, ``[2, E']``).

    Args:
        tree: the hierarchy over the graph's nodes (one tree or a forest).
        edge_index: ``[2, E]`` graph edges, integer node ids of leaves of ``tree`` (the
            graph's nodes); both ends of an edge must lie in the same tree of a forest.

    Returns:
        ``[2, E']`` long sibling pairs on the CPU, sorted.
    """
    parent, depth = tree.parent.cpu(), tree.depth.cpu()
    edge_index = edge_index.cpu()
    check_edge_index(edge_index, parent.numel())
    edge_index = edge_index.long()  # int32 ids: the pair key below is int64
    inner = ~tree.is_leaf.cpu()[edge_index.reshape(-1)]
    if bool(inner.any()):  # (a root and its child made a "sibling" pair)
        node = int(edge_index.reshape(-1)[inner][0])
        raise ValueError(f"edge_index must join leaves of the tree: node {node} is internal")
    a, b = edge_index
    keep = a != b
    a, b = a[keep], b[keep]
    while True:  # lift the deeper end until both ends are siblings
        done = parent[a] == parent[b]
        if bool(done.all()):
            break
        if bool((~done & (parent[a] == a) & (parent[b] == b)).any()):
            raise ValueError("edge_index has edges between different trees of the forest")
        lift_a = ~done & (depth[a] >= depth[b])
        lift_b = ~done & (depth[b] >= depth[a])
        a = torch.where(lift_a, parent[a], a)
        b = torch.where(lift_b, parent[b], b)
    a, b = a[a != b], b[a != b]
    key = torch.unique(a * parent.numel() + b)  # sorted, deduplicated pairs
    return torch.stack([key // parent.numel(), key % parent.numel()])


def hierarchy_stats(data: HierarchicalGraph | SignalHierarchy) -> dict[str, int | float]:
    """Family-size statistics: number of leaves, number of families, min/mean/median/max
    size (NaN for a tree of one node, which has no family), height.

    Args:
        data: a :class:`HierarchicalGraph` (its :meth:`~HierarchicalGraph.hierarchy`) or a
            :class:`~hiergraph.data.SignalHierarchy`, or a batch of them.

    Returns:
        a dict with the ints ``num_leaves``, ``num_families`` and ``height`` and the
        floats ``family_min``, ``family_mean``, ``family_median`` and ``family_max``.
    """
    tree = data.hierarchy() if isinstance(data, HierarchicalGraph) else data
    if not isinstance(tree, Data) or any(key not in tree for key in ("parent", "is_leaf")):
        raise TypeError(
            "data must be a HierarchicalGraph or a SignalHierarchy (or a batch of them), got "
            f"{type(data).__name__}" + (" without parent/is_leaf" if isinstance(data, Data) else "")
        )
    parent = tree.parent
    nodes = torch.arange(parent.numel(), device=parent.device)
    sizes = torch.bincount(parent[parent != nodes], minlength=parent.numel())
    sizes = sizes[~tree.is_leaf].float()
    some = sizes.numel() > 0
    return {
        "num_leaves": int(tree.is_leaf.sum()),
        "num_families": int(sizes.numel()),
        "family_min": float(sizes.min()) if some else math.nan,
        "family_mean": float(sizes.mean()) if some else math.nan,
        "family_median": float(sizes.median()) if some else math.nan,
        "family_max": float(sizes.max()) if some else math.nan,
        "height": int(tree.depth.max()),
    }


def _require_metis() -> None:
    import torch_geometric.typing as pyg_typing

    if not (pyg_typing.WITH_METIS or importlib.util.find_spec("pymetis")):
        raise ImportError(
            "method='metis' needs METIS from pymetis (pip install hiergraph[metis]), "
            "torch-sparse or pyg-lib, and none is installed; install one or use "
            "method='louvain'"
        )


def _metis_parts(num_nodes: int, edges: np.ndarray, num_parts: int, seed: int) -> np.ndarray:
    """METIS k-way part of every node of a graph given as ``[2, E]`` edges (as PyG's
    ClusterData): torch-sparse's or pyg-lib's METIS when PyG has one, else pymetis's
    (seeded with ``seed``)."""
    import torch_geometric.typing as pyg_typing
    from torch_geometric.utils import index_sort, to_undirected

    edge_index = to_undirected(torch.as_tensor(edges, dtype=torch.long), num_nodes=num_nodes)
    row, col = edge_index
    row, perm = index_sort(row, max_value=num_nodes)
    col = col[perm]
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.long)
    rowptr[1:] = torch.bincount(row, minlength=num_nodes).cumsum(0)
    if not pyg_typing.WITH_METIS:
        import pymetis

        graph = pymetis.CSRAdjacency(rowptr.numpy(), col.numpy())
        options = pymetis.Options(seed=seed)
        part = pymetis.part_graph(num_parts, graph, recursive=False, options=options).vertex_part
        return np.asarray(part, dtype=np.int64)
    if pyg_typing.WITH_TORCH_SPARSE:
        part = torch.ops.torch_sparse.partition(rowptr, col, None, num_parts, False)
    else:
        import pyg_lib

        part = pyg_lib.partition.metis(rowptr, col, num_parts, recursive=False)
    return part.numpy()


def _unit_graph(num_units: int, src: np.ndarray, dst: np.ndarray) -> nx.Graph:
    """The quotient graph of ``num_units`` units linked by the edges ``src -> dst``."""
    graph = nx.Graph()
    graph.add_nodes_from(range(num_units))
    graph.add_edges_from(zip(src.tolist(), dst.tolist(), strict=True))
    return graph


class _Builder:
    """Bottom-up construction of the parent vector (``-1`` for the root)."""

    def __init__(self, transform: GraphHierarchy, num_nodes: int, edges: np.ndarray):
        self.t = transform
        self.n = num_nodes
        self.edges = edges[:, edges[0] != edges[1]]
        self.parent: list[int] = [-1] * num_nodes
        self.members: list[np.ndarray] = [np.array([i]) for i in range(num_nodes)]

    def build(self) -> list[int]:
        units = list(range(self.n))
        if self.t.method == "louvain":
            for partition in self._louvain_levels():
                community = np.empty(self.n, dtype=np.int64)
                for c, nodes in enumerate(partition):
                    community[list(nodes)] = c
                groups: dict[int, list[int]] = {}
                for u in units:  # Louvain levels are nested: a unit lies in one community
                    groups.setdefault(int(community[self.members[u][0]]), []).append(u)
                units = [self._join(g) for _, g in sorted(groups.items())]
        root = self._join(units)
        if root < self.n:  # a single graph node: it still needs a root above it
            root = self._new_parent([root])
        return self.parent

    def _louvain_levels(self) -> list:
        graph = _unit_graph(self.n, *self.edges)
        levels = []
        parts = nx.community.louvain_partitions(
            graph, resolution=self.t.resolution, seed=self.t.seed
        )
        for partition in parts:
            if self.t.levels is not None and len(levels) >= self.t.levels:
                break
            levels.append(sorted(partition, key=min))
        return levels

    def _join(self, units: list[int]) -> int:
        """One node over ``units``, with intermediate nodes so no family exceeds max_family."""
        while len(units) > self.t.max_family:
            units = [g[0] if len(g) == 1 else self._new_parent(g) for g in self._split(units)]
        return units[0] if len(units) == 1 else self._new_parent(units)

    def _new_parent(self, children: list[int]) -> int:
        node = len(self.parent)
        self.parent.append(-1)
        for c in children:
            self.parent[c] = node
        self.members.append(np.concatenate([self.members[c] for c in children]))
        return node

    def _split(self, units: list[int]) -> list[list[int]]:
        """Groups of at most max_family units, linked units together where possible."""
        m = self.t.max_family
        unit_of = np.full(self.n, -1, dtype=np.int64)
        for i, u in enumerate(units):
            unit_of[self.members[u]] = i
        src, dst = unit_of[self.edges[0]], unit_of[self.edges[1]]
        inside = (src >= 0) & (dst >= 0) & (src != dst)
        src, dst = src[inside], dst[inside]
        k = math.ceil(len(units) / m)
        quotient = None  # networkx graph of the units, built only where it is needed
        if self.t.method == "metis":
            part = _metis_parts(len(units), np.stack([src, dst]), k, self.t.seed)
            communities = [np.nonzero(part == p)[0].tolist() for p in np.unique(part)]
        else:
            quotient = _unit_graph(len(units), src, dst)
            communities = nx.community.louvain_communities(
                quotient, resolution=self.t.resolution, seed=self.t.seed
            )
            communities = sorted((sorted(c) for c in communities), key=lambda c: c[0])
        if len(communities) == 1:  # no split (no community structure): chunk in BFS order
            if quotient is None:
                quotient = _unit_graph(len(units), src, dst)
            order = [v for c in nx.connected_components(quotient) for v in sorted(c)]
            order = list(nx.bfs_tree(quotient, order[0])) if order else order
            seen = set(order)
            order += [v for v in range(len(units)) if v not in seen]
            communities = [c.tolist() for c in np.array_split(np.array(order), k)]
        groups: list[list[int]] = []
        for c in communities:
            members = [units[i] for i in c]
            if len(members) > m:
                groups.extend(self._split(members))
            elif groups and len(groups[-1]) + len(members) <= m:
                groups[-1].extend(members)  # pack small communities together
            else:
                groups.append(members)
        return groups
