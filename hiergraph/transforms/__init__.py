"""Transforms that turn graphs into signal hierarchies."""

from hiergraph.transforms.graph_hierarchy import (
    GraphHierarchy,
    HierarchicalGraph,
    hierarchy_stats,
    sibling_edges,
)

__all__ = ["GraphHierarchy", "HierarchicalGraph", "hierarchy_stats", "sibling_edges"]
