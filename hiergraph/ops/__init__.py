"""Pure tensor functions (no ``nn.Module``): tree indexing, HSA, and other attention ops."""

from hiergraph.ops.hsa import hierarchical_attention
from hiergraph.ops.hsa_dense import hierarchical_attention_matrix, hierarchy_energy
from hiergraph.ops.logspace import log_gates, logaddexp, masked_softmax
from hiergraph.ops.tree_index import TreeIndex

__all__ = [
    "TreeIndex",
    "hierarchical_attention",
    "hierarchical_attention_matrix",
    "hierarchy_energy",
    "log_gates",
    "logaddexp",
    "masked_softmax",
]
