"""Batching for signal hierarchies on top of PyG's ``DataLoader``: leaf-budget batch samplers."""

from hiergraph.loader.leaf_budget_sampler import (
    DistributedLeafBudgetBatchSampler,
    LeafBudgetBatchSampler,
    leaf_counts,
    pack_by_budget,
)

__all__ = [
    "DistributedLeafBudgetBatchSampler",
    "LeafBudgetBatchSampler",
    "leaf_counts",
    "pack_by_budget",
]
