"""A fast community tree for big graphs: size-capped label propagation, coarsened level by level."""

from __future__ import annotations

from numbers import Integral

import torch
from torch import Tensor
from torch_geometric.utils import scatter

from hiergraph.ops.edge_index import check_edge_index


def label_propagation(
    num_nodes: int,
    edge_index: Tensor,
    edge_weight: Tensor,
    max_size: int,
    iterations: int = 10,
    seed: int = 0,
) -> Tensor:
    r"""Size-capped label propagation (Raghavan et al., 2007): clusters of at most
    ``max_size`` nodes.

    Every node starts in its own cluster. The nodes are split into two random
    halves (seeded, so the result is deterministic) that take turns: in each
    iteration the nodes of one half may move, node
    :math:`u` scores each neighbouring label :math:`\ell` by
    :math:`s_u(\ell) = \sum_{v \sim u,\ \mathrm{label}(v) = \ell} w_{uv}`, picks
    the best one among the clusters that are not full (ties: a seeded random
    priority of the labels) and moves if
    :math:`s_u(\ell) > s_u(\mathrm{label}(u))`. A cluster accepts movers, best
    score first, only while it has fewer than ``max_size`` members (sizes
    counted before anyone leaves, so the cap always holds). All steps are
    sorts and scatters over the ``E`` edges: :math:`O(E \log E)` per iteration.

    Two clusters that would trade members in one round (label :math:`a \to b`
    and :math:`b \to a`; e.g. two linked singletons, each preferring the
    other) would only swap labels, and could keep swapping: of such a pair of
    moves only the one toward the label of higher priority goes ahead, so the
    two merge.

    Args:
        num_nodes: ``n``.
        edge_index: ``[2, E]`` edges, both directions of every undirected
            edge, no self-loops.
        edge_weight: ``[E]`` positive weights.
        max_size: the largest cluster (``>= 1``).
        iterations: label-propagation rounds.
        seed: seed of the halves and of the tie-break priorities.

    Returns:
        ``[n]`` cluster id of every node (the smallest member id of its cluster).
    """
    label = torch.arange(num_nodes)
    size = torch.ones(num_nodes, dtype=torch.long)
    gen = torch.Generator().manual_seed(seed)
    priority = torch.randperm(num_nodes, generator=gen)  # tie-break among equal scores
    label_of_priority = torch.argsort(priority)
    src, dst = edge_index
    half = torch.randint(0, 2, (num_nodes,), generator=gen)
    for it in range(iterations):
        active = half == it % 2
        keep = active[src]
        key = src[keep] * num_nodes + label[dst[keep]]
        uniq, inverse = torch.unique(key, return_inverse=True)
        score = scatter(edge_weight[keep], inverse, 0, dim_size=uniq.numel(), reduce="sum")
        node, lab = uniq // num_nodes, uniq % num_nodes
        stay = lab == label[node]
        own = torch.zeros(num_nodes, dtype=score.dtype)
        own[node[stay]] = score[stay]
        open_ = stay | (size[lab] < max_size)  # full clusters take no one
        score, node, lab = score[open_], node[open_], lab[open_]
        best = scatter(score, node, 0, dim_size=num_nodes, reduce="max")
        is_best = (score == best[node]) & (score > own[node])
        # 1 + the priority of the chosen label; 0: no move (also for nodes with no candidate)
        top = scatter(torch.where(is_best, priority[lab] + 1, 0), node, 0, num_nodes, reduce="max")
        target = torch.where(top > 0, label_of_priority[(top - 1).clamp(min=0)], num_nodes)
        movers = (target < num_nodes).nonzero().view(-1)
        # two clusters trading members in one round would only swap labels (two linked
        # singletons would change places): of each such pair of moves, the one toward the
        # label of higher priority goes ahead
        source, goal = label[movers], target[movers]
        traded = torch.isin(goal * num_nodes + source, source * num_nodes + goal)
        movers = movers[~traded | (priority[goal] > priority[source])]
        if movers.numel() == 0:
            continue
        # best score first within each target cluster; the cap admits the first few
        order = torch.argsort(best[movers], descending=True, stable=True)
        order = order[torch.argsort(target[movers][order], stable=True)]
        movers, goal = movers[order], target[movers][order]
        first = torch.ones_like(goal, dtype=torch.bool)
        first[1:] = goal[1:] != goal[:-1]
        start = torch.cummax(torch.where(first, torch.arange(goal.numel()), 0), 0).values
        admitted = size[goal] + (torch.arange(goal.numel()) - start) < max_size
        movers, goal = movers[admitted], goal[admitted]
        size -= torch.bincount(label[movers], minlength=num_nodes)
        size += torch.bincount(goal, minlength=num_nodes)
        label[movers] = goal
    smallest = scatter(torch.arange(num_nodes), label, 0, dim_size=num_nodes, reduce="min")
    return smallest[label]


def label_propagation_tree(
    num_nodes: int, edge_index: Tensor, max_family: int, iterations: int = 10, seed: int = 0
) -> Tensor:
    r"""A community tree by repeated size-capped label propagation and coarsening.

    Level by level: cluster the current units (first the graph nodes) with
    :func:`label_propagation` (clusters of at most ``max_family`` units), give
    every cluster of two or more units a new parent node, keep single units
    as they are, and contract the graph (edge weights: the number of graph
    edges between two clusters). When a level merges too little (clusters
    left at more than 3/4 of the units, e.g. isolated nodes), the single units
    are packed, in order, into groups of ``max_family``. Once at most
    ``max_family`` units are left, a root takes them all.

    Args:
        num_nodes: ``n``, the number of graph nodes (the leaves, ids ``0..n-1``).
        edge_index: ``[2, E]`` graph edges (any direction; self-loops ignored).
        max_family: the largest number of children of a node (``>= 2``).
        iterations, seed: see :func:`label_propagation`.

    Returns:
        ``[T]`` parent of every tree node (``-1`` for the root); leaves are
        ``0..n-1``, internal nodes follow, each after its children.
    """
    if isinstance(max_family, bool) or not isinstance(max_family, Integral) or max_family < 2:
        raise ValueError(f"max_family must be an int >= 2, got {max_family!r}")
    max_family = int(max_family)  # (NumPy's too)
    edge_index = edge_index.cpu()
    check_edge_index(edge_index, num_nodes)
    edge_index = edge_index.long()
    src, dst = edge_index
    keep = src != dst
    src, dst = torch.cat([src[keep], dst[keep]]), torch.cat([dst[keep], src[keep]])
    weight = torch.ones(src.numel())
    units = torch.arange(num_nodes)  # tree node id of every current unit
    parent = torch.full((num_nodes,), -1, dtype=torch.long)
    while units.numel() > max_family:
        m = units.numel()
        src, dst, weight = _merge_parallel(src, dst, weight, m)
        edges = torch.stack([src, dst])
        cluster = label_propagation(m, edges, weight, max_family, iterations, seed)
        _, cluster = torch.unique(cluster, return_inverse=True)
        counts = torch.bincount(cluster)
        if counts.numel() > 0.75 * m:
            cluster, counts = _pack_singletons(cluster, counts, max_family)
        grouped = counts >= 2  # clusters that become new tree nodes
        new_id = torch.full_like(counts, -1)
        new_id[grouped] = parent.numel() + torch.arange(int(grouped.sum()))
        owner = new_id[cluster]
        parent = torch.cat([parent, torch.full((int(grouped.sum()),), -1, dtype=torch.long)])
        parent[units[owner >= 0]] = owner[owner >= 0]
        alone = torch.zeros_like(counts)
        alone[cluster[owner < 0]] = units[owner < 0]
        units = torch.where(grouped, new_id, alone)
        src, dst = cluster[src], cluster[dst]
        inside = src != dst
        src, dst, weight = src[inside], dst[inside], weight[inside]
    if units.numel() == 1 and int(units[0]) >= num_nodes:  # the last cluster is the root
        return parent
    parent = torch.cat([parent, torch.tensor([-1])])
    parent[units] = parent.numel() - 1
    return parent


def _merge_parallel(src: Tensor, dst: Tensor, weight: Tensor, m: int):
    """Sum the weights of parallel edges."""
    if src.numel() == 0:
        return src, dst, weight
    uniq, inverse = torch.unique(src * m + dst, return_inverse=True)
    return uniq // m, uniq % m, scatter(weight, inverse, 0, dim_size=uniq.numel(), reduce="sum")


def _pack_singletons(cluster: Tensor, counts: Tensor, max_family: int):
    """Join the one-unit clusters, in order, into groups of ``max_family``."""
    alone = counts[cluster] == 1
    units_alone = alone.nonzero().view(-1)
    base = int(cluster.max()) + 1
    cluster = cluster.clone()
    cluster[units_alone] = base + torch.arange(units_alone.numel()) // max_family
    _, cluster = torch.unique(cluster, return_inverse=True)
    return cluster, torch.bincount(cluster)
