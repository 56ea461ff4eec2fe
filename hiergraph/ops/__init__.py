"""Pure tensor functions (no ``nn.Module``), each with a dense reference, one subpackage or
module per method: HSA (:mod:`hiergraph.ops.hsa`), H-matrix attention
(:mod:`hiergraph.ops.hmatrix`), cone scores (:mod:`hiergraph.ops.cone`), VCC
(:mod:`hiergraph.ops.vcc`) and masked attention (:mod:`hiergraph.ops.masked`).
:mod:`~hiergraph.ops.logspace`, :mod:`~hiergraph.ops.topk` and
:mod:`~hiergraph.ops.edge_index` are shared by several of them."""

from hiergraph.data.windows import HMatrixLayout, hmatrix_layout
from hiergraph.ops.cone import (
    penumbral,
    penumbral_edge,
    psi_map,
    umbral,
    umbral_edge,
    xi_map,
)
from hiergraph.ops.edge_index import check_edge_index
from hiergraph.ops.hmatrix import (
    hmatrix_attention,
    hmatrix_attention_dense,
    hmatrix_attention_matrix,
    hmatrix_level_masks,
    hmatrix_logits,
)
from hiergraph.ops.hsa import (
    causal_hierarchical_attention,
    causal_hierarchical_attention_matrix,
    hierarchical_attention,
    hierarchical_attention_matrix,
    hierarchy_energy,
    root_scores,
    top_per_tree,
)
from hiergraph.ops.logspace import log_gates, logaddexp, masked_softmax
from hiergraph.ops.masked import (
    EdgeCSR,
    banded_attention,
    banded_attention_reference,
    edge_aggregate,
    edge_dot,
)
from hiergraph.ops.vcc import (
    PaddedSegmentTree,
    SegmentTree,
    compress,
    compression_matrices,
    decompress,
    partition_padded,
    select_padded,
    select_segments,
    update_tree,
    vcc_layer,
    vcc_layer_dense,
    vcc_layer_padded,
)

__all__ = [
    "EdgeCSR",
    "HMatrixLayout",
    "PaddedSegmentTree",
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
    "log_gates",
    "logaddexp",
    "masked_softmax",
    "partition_padded",
    "penumbral",
    "penumbral_edge",
    "psi_map",
    "root_scores",
    "select_padded",
    "select_segments",
    "top_per_tree",
    "umbral",
    "umbral_edge",
    "update_tree",
    "vcc_layer",
    "vcc_layer_dense",
    "vcc_layer_padded",
    "xi_map",
]
