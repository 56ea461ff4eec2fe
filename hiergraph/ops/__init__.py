"""Pure tensor functions (no ``nn.Module``): tree indexing, HSA, H-matrix, cone, VCC and
masked-attention ops, each with a dense reference."""

from hiergraph.ops.banded_attention import banded_attention, banded_attention_reference
from hiergraph.ops.cone import (
    penumbral,
    penumbral_edge,
    psi_map,
    umbral,
    umbral_edge,
    xi_map,
)
from hiergraph.ops.edge_index import check_edge_index
from hiergraph.ops.edge_products import EdgeCSR, edge_aggregate, edge_dot
from hiergraph.ops.hmatrix import (
    HMatrixLayout,
    hmatrix_attention,
    hmatrix_attention_dense,
    hmatrix_attention_matrix,
    hmatrix_layout,
    hmatrix_level_masks,
    hmatrix_logits,
    hmatrix_window_hierarchy,
)
from hiergraph.ops.hsa import hierarchical_attention
from hiergraph.ops.hsa_causal import causal_hierarchical_attention
from hiergraph.ops.hsa_causal_dense import causal_hierarchical_attention_matrix
from hiergraph.ops.hsa_dense import hierarchical_attention_matrix, hierarchy_energy
from hiergraph.ops.hubs import root_scores, top_per_tree
from hiergraph.ops.logspace import log_gates, logaddexp, masked_softmax
from hiergraph.ops.segment_tree import SegmentTree, select_segments, update_tree
from hiergraph.ops.vcc import compress, decompress, vcc_layer
from hiergraph.ops.vcc_dense import compression_matrices, vcc_layer_dense

__all__ = [
    "EdgeCSR",
    "HMatrixLayout",
    "SegmentTree",
    "banded_attention",
    "banded_attention_reference",
    "causal_hierarchical_attention",
    "causal_hierarchical_attention_matrix",
    "check_edge_index",
    "compress",
    "compression_matrices",
    "decompress",
    "edge_aggregate",
    "edge_dot",
    "hierarchical_attention",
    "hierarchical_attention_matrix",
    "hierarchy_energy",
    "hmatrix_attention",
    "hmatrix_attention_dense",
    "hmatrix_attention_matrix",
    "hmatrix_layout",
    "hmatrix_level_masks",
    "hmatrix_logits",
    "hmatrix_window_hierarchy",
    "log_gates",
    "logaddexp",
    "masked_softmax",
    "penumbral",
    "penumbral_edge",
    "psi_map",
    "root_scores",
    "select_segments",
    "top_per_tree",
    "umbral",
    "umbral_edge",
    "update_tree",
    "vcc_layer",
    "vcc_layer_dense",
    "xi_map",
]
