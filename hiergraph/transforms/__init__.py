"""Transforms that turn graphs into signal hierarchies."""

import torch

from hiergraph.transforms.graph_hierarchy import (
    GraphHierarchy,
    HierarchicalGraph,
    hierarchy_stats,
    sibling_edges,
)

__all__ = ["GraphHierarchy", "HierarchicalGraph", "hierarchy_stats", "sibling_edges"]

# ``torch.load(weights_only=True)``, PyTorch's default, reads saved graphs with their trees.
torch.serialization.add_safe_globals([HierarchicalGraph])
