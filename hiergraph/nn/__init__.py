"""Neural network modules (``torch.nn.Module`` layers), built on :mod:`hiergraph.ops`.

* HSA over trees: :class:`HierarchicalSelfAttention`, the encoder
  :class:`HierarchicalTransformerEncoder` (:class:`HTELayer`) and its causal decoder
  :class:`HTEDecoder` (:class:`HTEDecoderLayer`, KV caches :class:`HierarchicalKVCache`,
  :class:`FlatKVCache`); over graphs with a community tree: :class:`GraphHSAConv`,
  :class:`GraphHSANet`; position embeddings :class:`FamilyPositionEncoder`,
  :class:`LearnableFourierFeatures`; per-node-type projections :class:`TypedLinear`.
* Cone attention: :class:`ConeConv` (a ``MessagePassing`` layer), :class:`ConeAttention`
  (a drop-in for ``nn.MultiheadAttention``).
* Masked attention as message passing: :class:`MaskedAttentionConv`.
* H-matrix attention: :class:`HMatrixAttention`, the language model :class:`HTransformer1D`.
* VCC compression for long sequences: :class:`VCCEncoder`.
* Pooling over trees: :func:`global_leaf_mean_pool`, :func:`select_leaf`,
  :func:`coarsen_leaves`, :func:`leaf_batch`.
"""

from hiergraph.nn.cone_attention import ConeAttention
from hiergraph.nn.cone_conv import ConeConv
from hiergraph.nn.flat_kv_cache import FlatKVCache
from hiergraph.nn.graph_hsa import GraphHSAConv, GraphHSANet
from hiergraph.nn.hierarchical_attention import HierarchicalSelfAttention
from hiergraph.nn.hierarchical_kv_cache import HierarchicalKVCache
from hiergraph.nn.hmatrix_attention import HMatrixAttention
from hiergraph.nn.hte import HierarchicalTransformerEncoder, HTELayer
from hiergraph.nn.hte_decoder import HTEDecoder, HTEDecoderLayer
from hiergraph.nn.htransformer1d import HTransformer1D
from hiergraph.nn.kv_schedule import append_schedule, from_schedule
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
