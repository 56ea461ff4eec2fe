r"""Attention restricted to a relational mask, the kernels of
:class:`~hiergraph.nn.MaskedAttentionConv`.

Mijangos et al., *Relational inductive biases on attention mechanisms*: masked
attention is message passing on the mask's graph (Lemma 1, Def. 9–10). Modules:

* :mod:`~hiergraph.ops.masked.banded`: band masks (sliding, causal, dilated and
  block-diagonal windows) as blocked dense kernels, the fast path
  :func:`~hiergraph.ops.banded_attention` and its dense reference
  :func:`~hiergraph.ops.banded_attention_reference`;
* :mod:`~hiergraph.ops.masked.edge_products`: every other mask as sparse per-edge
  products, :func:`~hiergraph.ops.edge_dot` and :func:`~hiergraph.ops.edge_aggregate`
  over an :class:`~hiergraph.ops.EdgeCSR`, which form no per-edge feature tensor.

The ``edge_index`` checks and conversions they share with the cone convolutions live
in :mod:`hiergraph.ops.edge_index`.
"""

from hiergraph.ops.masked.banded import banded_attention, banded_attention_reference
from hiergraph.ops.masked.edge_products import EdgeCSR, edge_aggregate, edge_dot

__all__ = [
    "EdgeCSR",
    "banded_attention",
    "banded_attention_reference",
    "edge_aggregate",
    "edge_dot",
]
