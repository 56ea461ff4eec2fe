"""Neural network modules."""

from hiergraph.nn.hierarchical_attention import HierarchicalSelfAttention
from hiergraph.nn.hte import HierarchicalTransformerEncoder, HTELayer
from hiergraph.nn.pool import coarsen_leaves, global_leaf_mean_pool, leaf_batch, select_leaf
from hiergraph.nn.position import FamilyPositionEncoder, LearnableFourierFeatures
from hiergraph.nn.typed_linear import TypedLinear

__all__ = [
    "FamilyPositionEncoder",
    "HTELayer",
    "HierarchicalSelfAttention",
    "HierarchicalTransformerEncoder",
    "LearnableFourierFeatures",
    "TypedLinear",
    "coarsen_leaves",
    "global_leaf_mean_pool",
    "leaf_batch",
    "select_leaf",
]
