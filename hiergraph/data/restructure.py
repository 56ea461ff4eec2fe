"""Structural views of a signal hierarchy: the flat (one-level) view, local coarsening, and
leaves lifted to the root."""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.data import Batch

from hiergraph._checks import described
from hiergraph._device import reads_values
from hiergraph._runs import rank_within
from hiergraph.data.domain import Domain
from hiergraph.data.signal_hierarchy import SignalHierarchy
from hiergraph.plan.tree_index import TreeIndex


def tree_of_nodes(hierarchy) -> Tensor:
    """``[N]`` tree id of every node, the trees numbered in leaf order (tree ``t`` holds the
    first leaf that no tree before it holds), from the (cached) tree index: for PyG batches
    of single trees (equal to their ``batch``), forests built by this package
    (:func:`~hiergraph.data.window_forest`), forests assembled without ``batch`` (e.g.
    :meth:`~hiergraph.transforms.HierarchicalGraph.hierarchy` of a PyG batch), and PyG
    batches of forests, whose ``batch`` numbers the forests.

    Raises:
        ValueError: if a ``batch`` that should number the trees (one stored on a single
            hierarchy, or a PyG batch's own where it holds one tree per element:
            :func:`batch_numbers_trees`) numbers the nodes otherwise (on an accelerator, a
            device-side assertion fails instead: no host synchronisation): the ops follow
            the trees, so pooling by it would mix or split them.
    """
    index = TreeIndex.of(hierarchy)
    tree = index.leaf_order_tree  # (cached with the tree index)
    if isinstance(hierarchy, Batch):
        stored = hierarchy.batch if batch_numbers_trees(hierarchy) else None
    else:
        stored = hierarchy._store.get("batch")
    if stored is not None:
        message = (
            f"hierarchy.batch must number its {index.level_ptr[1]} trees in leaf order (0 for "
            "the first), as the ops do, or be deleted (del hierarchy.batch: it is derived then)"
        )
        if stored.shape != tree.shape or (reads_values(stored) and not torch.equal(stored, tree)):
            raise ValueError(message)
        if not reads_values(stored):  # (a device-side assertion: no host synchronisation)
            torch._assert_async(stored.eq(tree).all(), message)
    return tree


def batch_numbers_trees(hierarchy) -> bool:
    """Whether ``hierarchy`` is a PyG batch whose ``batch`` numbers its trees: a batch of
    single trees, not one of forests (of :func:`~hiergraph.data.window_forest`, say), whose
    ``batch`` numbers the forests, each of several trees."""
    if not isinstance(hierarchy, Batch) or "batch" not in hierarchy or hierarchy.batch is None:
        return False  # (a SignalHierarchy's batch property derives one from here)
    roots = TreeIndex.of(hierarchy).level_ptr[1]  # level 0 holds the roots
    return hierarchy.num_graphs == roots


def flatten_hierarchy(hierarchy) -> SignalHierarchy:
    """The one-level view of every tree: its leaves become children of its root.

    HSA on the flat view is softmax attention among each tree's leaves (the
    "FSA" baseline of the HSA paper). Leaves keep their order, features,
    node types; their position becomes their index in the tree's leaf
    sequence (a 1-D grid). The result carries ``batch`` (tree id per node)
    but is meant for computation, not for ``to_data_list``.

    Args:
        hierarchy: one tree or a batch/forest.
    """
    leaf_node = TreeIndex.of(hierarchy).leaf_node
    tree = tree_of_nodes(hierarchy)
    leaf_tree = tree.index_select(0, leaf_node)
    num_trees = int(tree.max()) + 1 if tree.numel() else 0
    num_leaves = leaf_node.numel()
    device = leaf_node.device
    slot = rank_within(leaf_tree, num_trees)  # the leaf's index in its tree's sequence
    roots = torch.arange(num_trees, device=device)
    parent = torch.cat([num_leaves + leaf_tree, num_leaves + roots])
    zeros = torch.zeros(num_trees, dtype=torch.long, device=device)
    out = SignalHierarchy._assemble(
        parent=parent,
        is_leaf=torch.cat([torch.ones(num_leaves, dtype=torch.bool, device=device), zeros.bool()]),
        depth=torch.cat([torch.ones_like(slot), zeros]),
        slot=torch.cat([slot, zeros]),
        node_type=torch.cat([hierarchy.node_type.index_select(0, leaf_node), zeros]),
        domain=torch.cat([torch.full_like(slot, int(Domain.GRID1D)), zeros]),
        pos=torch.stack([torch.cat([slot, zeros]), torch.cat([torch.zeros_like(slot), zeros])], 1),
        x=hierarchy.x if "x" in hierarchy else None,
    )
    out.batch = torch.cat([leaf_tree, roots])
    return out


def coarsen_hierarchy(hierarchy) -> tuple[SignalHierarchy, Tensor]:
    """Local coarsening: every internal node whose children are all leaves becomes a leaf.

    New leaves are ordered per tree: the kept old leaves first (in their old
    order), then the collapsed nodes.

    Args:
        hierarchy: one tree or a batch/forest.

    Returns:
        the coarser hierarchy (one tree or a batch, with ``batch`` set; without
        ``x``) and ``cluster [L_old]``: the new leaf each old leaf is pooled into
        (a leaf that is kept maps to itself).
    """
    parent, is_leaf = hierarchy.parent, hierarchy.is_leaf
    n = parent.numel()
    nodes = torch.arange(n, device=parent.device)
    non_root = parent != nodes
    internal_children = torch.zeros(n, dtype=torch.long, device=parent.device).index_add_(
        0, parent[non_root], (~is_leaf[non_root]).long()
    )
    collapse = ~is_leaf & (internal_children == 0)
    removed = is_leaf & non_root & collapse[parent]
    new_leaf = (is_leaf & ~removed) | collapse
    tree = tree_of_nodes(hierarchy)
    kept = (~removed).nonzero().view(-1)
    key = tree[kept] * (2 * n) + (~new_leaf[kept]).long() * n + kept
    order = kept[torch.argsort(key)]
    new_id = torch.full((n,), -1, dtype=torch.long, device=parent.device)
    new_id[order] = torch.arange(order.numel(), device=parent.device)
    coarse = SignalHierarchy._assemble(
        parent=new_id[parent[order]],
        is_leaf=new_leaf[order],
        depth=hierarchy.depth[order],
        slot=hierarchy.slot[order],
        node_type=hierarchy.node_type[order],
        domain=hierarchy.domain[order],
        pos=hierarchy.pos[order],
        x=None,
    )
    coarse.batch = tree[order]
    leaf_node = TreeIndex.of(hierarchy).leaf_node
    target = torch.where(removed[leaf_node], parent[leaf_node], leaf_node)
    leaf_rank = torch.cumsum(coarse.is_leaf.long(), 0) - 1  # node id -> leaf-order index
    return coarse, leaf_rank[new_id[target]]


def lift_leaves(hierarchy, leaves: Tensor) -> tuple[SignalHierarchy, Tensor]:
    r"""Hang the chosen leaves directly under their tree's root ("hub" leaves).

    Every chosen leaf becomes a child of its root, placed after the root's
    other children, in a :attr:`~hiergraph.data.Domain.SET` position (no
    position bias); internal nodes left without leaves are removed. The
    leaf order (and so ``x``) is unchanged, so HSA on the result uses the same
    leaf rows. Lifting every leaf of a tree gives its flat view: HSA becomes
    softmax attention over the tree's leaves; lifting none returns the same
    tree. With ``g`` hubs, every leaf attends to each hub through the hub's
    own key and value, at the root level, instead of through the mean of the
    block the hub sits in.

    Args:
        hierarchy: one tree or a batch/forest.
        leaves: ``[L]`` bool (in leaf order), ``True`` for the leaves to lift.

    Returns:
        the new hierarchy (with ``batch``) and ``node [N']``: the old node id of
        every new node, to carry per-node tensors over (``pos_emb[node]``).
    """
    parent, is_leaf = hierarchy.parent, hierarchy.is_leaf
    n, device = parent.numel(), parent.device
    index = TreeIndex.of(hierarchy)
    leaf_node = index.leaf_node
    if not isinstance(leaves, Tensor):  # (a list: an AttributeError)
        raise TypeError(f"leaves must be a bool tensor in leaf order, got {described(leaves)}")
    if leaves.dtype != torch.bool or leaves.shape != leaf_node.shape:
        raise ValueError(
            f"leaves must be a [{leaf_node.numel()}] bool mask in leaf order, got "
            f"{described(leaves)}"
        )
    nodes = torch.arange(n, device=device)
    tree = tree_of_nodes(hierarchy)
    is_root = parent == nodes
    leaves = leaves & ~is_root[leaf_node]  # a one-node tree's leaf is its root: nothing to lift
    root_of_tree = torch.empty(int(tree.max()) + 1, dtype=torch.long, device=device)
    root_of_tree[tree[is_root]] = nodes[is_root]
    hubs = leaf_node[leaves]
    lifted = torch.zeros(n, dtype=torch.bool, device=device)
    lifted[hubs] = True
    # an internal node survives if a leaf that stays in place lies below it
    alive = is_leaf | is_root
    below = leaf_node[~leaves]
    for _ in range(index.num_levels - 1):
        below = parent[below]
        alive[below] = True
    # slots of the lifted leaves: after the root's other children, in leaf order
    hub_root = root_of_tree[tree[hubs]]
    last = torch.full((n,), -1, dtype=torch.long, device=device)
    stays = ~is_root & ~lifted & alive
    last.scatter_reduce_(0, parent[stays], hierarchy.slot[stays], reduce="amax")
    new_parent, slot = parent.clone(), hierarchy.slot.clone()
    new_parent[hubs] = hub_root
    slot[hubs] = last[hub_root] + 1 + rank_within(hub_root, n)
    depth, domain, pos = hierarchy.depth.clone(), hierarchy.domain.clone(), hierarchy.pos.clone()
    depth[hubs], domain[hubs], pos[hubs] = 1, int(Domain.SET), 0
    keep = alive.nonzero().view(-1)
    new_id = torch.full((n,), -1, dtype=torch.long, device=device)
    new_id[keep] = torch.arange(keep.numel(), device=device)
    out = SignalHierarchy._assemble(
        parent=new_id[new_parent[keep]],
        is_leaf=is_leaf[keep],
        depth=depth[keep],
        slot=slot[keep],
        node_type=hierarchy.node_type[keep],
        domain=domain[keep],
        pos=pos[keep],
        x=hierarchy.x if "x" in hierarchy else None,
    )
    out.batch = tree[keep]
    return out, keep
