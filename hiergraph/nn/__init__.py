"""Neural network modules."""

from hiergraph.nn.cone_attention import ConeAttention
from hiergraph.nn.cone_conv import ConeConv
from hiergraph.nn.graph_hsa import GraphHSAConv, GraphHSANet
from hiergraph.nn.hierarchical_attention import HierarchicalSelfAttention
from hiergraph.nn.hmatrix_attention import HMatrixAttention
from hiergraph.nn.hte import HierarchicalTransformerEncoder, HTELayer
from hiergraph.nn.hte_decoder import HTEDecoder, HTEDecoderLayer
from hiergraph.nn.htransformer1d import HTransformer1D
from hiergraph.nn.kv_cache import FlatKVCache, HierarchicalKVCache, append_schedule, from_schedule
from hiergraph.nn.masked_attention_conv import MaskedAttentionConv
from hiergraph.nn.pool import coarsen_leaves, global_leaf_mean_pool, leaf_batch, select_leaf
from hiergraph.nn.position import FamilyPositionEncoder, LearnableFourierFeatures
from hiergraph.nn.typed_linear import TypedLinear
from hiergraph.nn.vcc import VCCEncoder

__all__ = [
    "ConeAttention",
    "ConeConv",
    "FamilyPositionEncoder",
    "FlatKVCache",
    "GraphHSAConv",
    "GraphHSANet",
    "HMatrixAttention",
    "HTEDecoder",
    "HTEDecoderLayer",
    "HTELayer",
    "HTransformer1D",
    "HierarchicalKVCache",
    "HierarchicalSelfAttention",
    "HierarchicalTransformerEncoder",
    "LearnableFourierFeatures",
    "MaskedAttentionConv",
    "TypedLinear",
    "VCCEncoder",
    "append_schedule",
    "from_schedule",
    "coarsen_leaves",
    "global_leaf_mean_pool",
    "leaf_batch",
    "select_leaf",
]
