"""Pooling over signal hierarchies: global, select-a-leaf, and local coarsening."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor
from torch_geometric.data import Batch
from torch_geometric.nn import global_mean_pool
from torch_geometric.utils import scatter

from hiergraph._checks import as_int, holds_integers, refuse_where
from hiergraph._precision import accumulation_dtype
from hiergraph.data.restructure import coarsen_hierarchy, tree_of_nodes
from hiergraph.data.signal_hierarchy import as_hierarchy
from hiergraph.ops.hsa.inputs import check_structure_device
from hiergraph.plan.tree_index import TreeIndex

if TYPE_CHECKING:
    from hiergraph.data.signal_hierarchy import SignalHierarchy


def leaf_batch(hierarchy: SignalHierarchy | Batch) -> Tensor:
    """``[L]`` tree id of every leaf, in leaf order (the ``batch`` vector of the leaf
    features, for PyG's pooling functions).

    Args:
        hierarchy (SignalHierarchy or Batch): a tree or a batch.
    """
    return _leaf_batch(as_hierarchy(hierarchy))


def _leaf_batch(hierarchy: SignalHierarchy | Batch) -> Tensor:
    """:func:`leaf_batch` of a hierarchy already resolved by ``as_hierarchy``."""
    return tree_of_nodes(hierarchy).index_select(0, TreeIndex.of(hierarchy).leaf_node)


def _num_trees(hierarchy: SignalHierarchy | Batch) -> int:
    """How many trees :func:`tree_of_nodes` numbers, from host-side sizes (the tree index's
    root count): no device read."""
    level_ptr = TreeIndex.of(hierarchy).level_ptr  # level 0: the roots
    return level_ptr[1] - level_ptr[0]


def global_leaf_mean_pool(
    x: Tensor, hierarchy: SignalHierarchy | Batch, leaf_mask: Tensor | None = None
) -> Tensor:
    r"""Mean of the leaf features of every tree: ``[L, C]`` → ``[num_trees, C]``.

    .. math:: \mathbf{r}_T = \frac{1}{|\ell(T)|}\sum_{i \in \ell(T)} \mathbf{x}_i

    Padding leaves (``leaf_mask`` false; a ``[L]`` bool tensor) are left out.
    Half-precision features are summed in float32 and the means rounded once (a
    bf16 running sum stalls at 256, an fp16 one overflows past 65504).

    Args:
        x (torch.Tensor): ``[L, C]`` leaf features.
        hierarchy (SignalHierarchy or Batch): a tree or a batch.
        leaf_mask (torch.Tensor, optional): ``[L]`` bool, ``True`` = valid leaf,
            ``False`` = padding. (default: :obj:`None`, all valid)
    """
    hierarchy = as_hierarchy(hierarchy)
    batch = _leaf_batch(hierarchy)
    _check_leaf_rows(x, batch.numel(), batch.device)
    _check_averaged(x)
    size = _num_trees(hierarchy)
    dtype = accumulation_dtype(x.dtype)
    if leaf_mask is None:
        return global_mean_pool(x.to(dtype), batch, size=size).to(x.dtype)
    if leaf_mask.dtype != torch.bool or leaf_mask.shape != batch.shape:
        raise ValueError(
            f"leaf_mask must be a bool tensor of shape [{batch.numel()}] (one flag per "
            f"leaf), got {leaf_mask.dtype} of shape {tuple(leaf_mask.shape)}"
        )
    # sums over all leaves with the padding zeroed (masked_fill: no NaN/inf leaks), not a
    # boolean selection of the kept rows, whose size the host would have to read
    keep = leaf_mask.view(-1, *[1] * (x.dim() - 1))
    total = scatter(x.to(dtype).masked_fill(~keep, 0.0), batch, 0, dim_size=size, reduce="sum")
    count = scatter(leaf_mask.to(dtype), batch, 0, dim_size=size, reduce="sum").clamp(min=1)
    return (total / count.view(-1, *[1] * (x.dim() - 1))).to(x.dtype)


def select_leaf(
    x: Tensor, hierarchy: SignalHierarchy | Batch, position: int | Tensor = 0
) -> Tensor:
    """The features of one leaf per tree (e.g. a CLS-like first token): ``[num_trees, C]``.

    Args:
        x (torch.Tensor): ``[L, C]`` leaf features.
        hierarchy (SignalHierarchy or Batch): a tree or a batch.
        position (int or torch.Tensor, optional): the leaf's index within its
            tree's leaves (an int, or a ``[num_trees]`` tensor); negative values
            count from the end. (default: :obj:`0`)
    """
    hierarchy = as_hierarchy(hierarchy)
    batch = _leaf_batch(hierarchy)
    _check_leaf_rows(x, batch.numel(), batch.device)
    num_trees = _num_trees(hierarchy)
    counts = batch.new_zeros(num_trees).index_add_(0, batch, torch.ones_like(batch))
    first = torch.cumsum(counts, 0) - counts
    if isinstance(position, Tensor):
        if position.dim() > 1 or position.numel() not in (1, num_trees):
            raise ValueError(
                f"position must be an int or a [num_trees={num_trees}] tensor, got shape "
                f"{tuple(position.shape)}"
            )
        if not holds_integers(position):  # (an index_select error)
            raise TypeError(f"position must hold integers, got {position.dtype}")
        position = position.to(x.device).expand(num_trees)
    else:  # a fill, not a host-to-device copy (1.5 was leaf 1)
        position = torch.full((num_trees,), as_int(position, "position"), device=x.device)
    asked, position = position, torch.where(position < 0, position + counts, position)
    refuse_where(
        ((position < 0) | (position >= counts)).any(),
        "position out of range",
        found=lambda: f"{asked.tolist()} for trees with {counts.tolist()} leaves",
    )
    return x.index_select(0, first + position)


def coarsen_leaves(
    x: Tensor, hierarchy: SignalHierarchy | Batch, reduce: str = "mean"
) -> tuple[Tensor, SignalHierarchy, Tensor]:
    """Pool leaves into their parents wherever a node's children are all leaves.

    Apply repeatedly to climb the tree. Half-precision features are pooled in
    float32 and rounded once (on GPUs a half-precision sum adds atomically, rounding at
    every child).

    Args:
        x (torch.Tensor): ``[L, ...]`` leaf features, one row per leaf in leaf order,
            on the hierarchy's device; floating-point for ``reduce="mean"``.
        hierarchy (SignalHierarchy or Batch): a tree or a batch.
        reduce (str, optional): how the children's rows combine, a ``reduce`` of
            :func:`torch_geometric.utils.scatter` (``"sum"``, ``"mean"``, ``"min"``,
            ``"max"``, ``"mul"``). (default: :obj:`"mean"`)

    Returns:
        ``(x_coarse, coarse_hierarchy, cluster)``: the pooled features of the new
        leaves (in ``x``'s dtype), the coarser hierarchy
        (:func:`~hiergraph.data.coarsen_hierarchy`) and the new leaf of every old leaf.
    """
    hierarchy = as_hierarchy(hierarchy)
    _check_leaf_rows(x, int(hierarchy.is_leaf.sum()), hierarchy.is_leaf.device)
    if reduce == "mean":
        _check_averaged(x)
    coarse, cluster = coarsen_hierarchy(hierarchy)
    num_new = int(coarse.is_leaf.sum())
    pooled = scatter(x.to(accumulation_dtype(x.dtype)), cluster, 0, dim_size=num_new, reduce=reduce)
    return pooled.to(x.dtype), coarse, cluster


def _check_averaged(x: Tensor) -> None:
    """Raise unless ``x`` can be averaged: a mean of integers (token ids, say) was floored."""
    if not x.is_floating_point():
        raise TypeError(
            f"x must be floating-point to be averaged, got {x.dtype} (token ids? embed them "
            "first; counts: x.float())"
        )


def _check_leaf_rows(x: Tensor, num_leaves: int, device: torch.device) -> None:
    """Raise unless ``x`` has one row per leaf, on the hierarchy's ``device``."""
    if not isinstance(x, Tensor) or x.dim() == 0 or x.size(0) != num_leaves:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must have one row per leaf, [{num_leaves}, ...], got {shape}")
    check_structure_device(device, x, "x")
