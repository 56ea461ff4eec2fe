"""Pooling over signal hierarchies: global, select-a-leaf, and local coarsening."""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.nn import global_mean_pool
from torch_geometric.utils import scatter

from hiergraph.data.transforms import coarsen_hierarchy, tree_of_nodes
from hiergraph.ops.precision import accumulation_dtype


def leaf_batch(hierarchy) -> Tensor:
    """``[L]`` tree id of every leaf, in leaf order."""
    return tree_of_nodes(hierarchy).index_select(0, hierarchy.tree_index().leaf_node)


def global_leaf_mean_pool(x: Tensor, hierarchy, leaf_mask: Tensor | None = None) -> Tensor:
    r"""Mean of the leaf features of every tree: ``[L, C]`` → ``[num_trees, C]``.

    .. math:: \mathbf{r}_T = \frac{1}{|\ell(T)|}\sum_{i \in \ell(T)} \mathbf{x}_i

    Padding leaves (``leaf_mask`` false; a ``[L]`` bool tensor) are left out.
    Half-precision features are summed in float32 and the means rounded once (a
    bf16 running sum stalls at 256, an fp16 one overflows past 65504).
    """
    batch = leaf_batch(hierarchy)
    size = int(tree_of_nodes(hierarchy).max()) + 1
    if leaf_mask is not None:
        if leaf_mask.dtype != torch.bool or leaf_mask.shape != batch.shape:
            raise ValueError(
                f"leaf_mask must be a bool tensor of shape [{batch.numel()}] (one flag per "
                f"leaf), got {leaf_mask.dtype} of shape {tuple(leaf_mask.shape)}"
            )
        x, batch = x[leaf_mask], batch[leaf_mask]
    return global_mean_pool(x.to(accumulation_dtype(x.dtype)), batch, size=size).to(x.dtype)


def select_leaf(x: Tensor, hierarchy, position: int | Tensor = 0) -> Tensor:
    """The features of one leaf per tree (e.g. a CLS-like first token): ``[num_trees, C]``.

    Args:
        x: ``[L, C]`` leaf features.
        hierarchy: a tree or a batch.
        position: the leaf's index within its tree's leaves (an int, or a
            ``[num_trees]`` tensor); negative values count from the end.
    """
    batch = leaf_batch(hierarchy)
    num_trees = int(tree_of_nodes(hierarchy).max()) + 1
    counts = torch.bincount(batch, minlength=num_trees)
    first = torch.cumsum(counts, 0) - counts
    position = torch.as_tensor(position, device=x.device).expand(num_trees)
    position = torch.where(position < 0, position + counts, position)
    if bool(((position < 0) | (position >= counts)).any()):
        raise ValueError(f"leaf position out of range for trees with {counts.tolist()} leaves")
    return x.index_select(0, first + position)


def coarsen_leaves(x: Tensor, hierarchy, reduce: str = "mean"):
    """Pool leaves into their parents wherever a node's children are all leaves.

    Returns ``(x_coarse, coarse_hierarchy, cluster)``: the pooled features
    of the new leaves, the coarser hierarchy
    (:func:`~hiergraph.data.coarsen_hierarchy`) and the new leaf of every
    old leaf. Apply repeatedly to climb the tree.
    """
    coarse, cluster = coarsen_hierarchy(hierarchy)
    num_new = int(coarse.is_leaf.sum())
    return scatter(x, cluster, dim=0, dim_size=num_new, reduce=reduce), coarse, cluster
