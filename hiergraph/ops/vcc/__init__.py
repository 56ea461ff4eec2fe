r"""VIP-token-centric compression (VCC) of transformer layers.

Zeng et al., *VCC: Scaling Transformers to 128K Tokens or More by Prioritizing
Important Tokens* (Sec. 3): a layer runs on the VIP tokens and a compressed
partition of the other tokens, chosen by the VIP tokens, and its update goes back
to every token. Modules:

* :mod:`~hiergraph.ops.vcc.padded`: the static-shape form :class:`~hiergraph.nn.VCCEncoder`
  runs on (padded sequences, fixed-size selections, no host synchronisation):
  :func:`~hiergraph.ops.partition_padded`, :class:`~hiergraph.ops.PaddedSegmentTree`,
  :func:`~hiergraph.ops.select_padded`, :func:`~hiergraph.ops.vcc_layer_padded`;
* :mod:`~hiergraph.ops.vcc.layer`: the ragged form on flat sequences (``ptr``, PyG style),
  :func:`~hiergraph.ops.vcc_layer` with :func:`~hiergraph.ops.compress` and
  :func:`~hiergraph.ops.decompress`: Alg. 2's :math:`O(r)` tree updates, with selections
  of value-dependent size (read on the host);
* :mod:`~hiergraph.ops.vcc.dense`: the dense reference with explicit
  :math:`S, S^\dagger, D` (:func:`~hiergraph.ops.compression_matrices`,
  :func:`~hiergraph.ops.vcc_layer_dense`);
* :mod:`~hiergraph.ops.vcc.segment_tree`: the multi-resolution segment tree the ragged
  form stores the tokens in (Sec. 3.3–3.4, Alg. 1–2): :class:`~hiergraph.ops.SegmentTree`,
  :func:`~hiergraph.ops.select_segments`, :func:`~hiergraph.ops.update_tree`.
"""

from hiergraph.ops.vcc.dense import compression_matrices, vcc_layer_dense
from hiergraph.ops.vcc.layer import compress, decompress, vcc_layer
from hiergraph.ops.vcc.padded import (
    PaddedSegmentTree,
    partition_padded,
    select_padded,
    vcc_layer_padded,
)
from hiergraph.ops.vcc.segment_tree import SegmentTree, select_segments, update_tree

__all__ = [
    "PaddedSegmentTree",
    "SegmentTree",
    "compress",
    "compression_matrices",
    "decompress",
    "partition_padded",
    "select_padded",
    "select_segments",
    "update_tree",
    "vcc_layer",
    "vcc_layer_dense",
    "vcc_layer_padded",
]
