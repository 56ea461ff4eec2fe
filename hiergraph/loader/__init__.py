"""Batching for signal hierarchies on top of PyG's ``DataLoader``: leaf-budget batch samplers
and a loader that builds each batch's tree index at collation."""

from hiergraph.loader.hierarchy_loader import HierarchyLoader
from hiergraph.loader.leaf_budget_sampler import (
    DistributedLeafBudgetBatchSampler,
    LeafBudgetBatchSampler,
    leaf_counts,
    pack_by_budget,
)

__all__ = [
    "DistributedLeafBudgetBatchSampler",
    "HierarchyLoader",
    "LeafBudgetBatchSampler",
    "leaf_counts",
    "pack_by_budget",
]
