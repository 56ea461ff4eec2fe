"""Relational masks as ``edge_index`` (source = key/value, target = query),
their banded descriptors, dense converters, batching and equivariance tools
(Mijangos et al., *Relational inductive biases on attention mechanisms*: masked
attention as a graph layer, Lemma 1 and Def. 10)."""

from hiergraph.masks.band import BandMask
from hiergraph.masks.batch import sequence_batch
from hiergraph.masks.builders import (
    block_diagonal_mask,
    causal_mask,
    cross_mask,
    dilated_mask,
    full_mask,
    global_tokens_mask,
    graph_mask,
    random_mask,
    sibling_mask,
    window_mask,
)
from hiergraph.masks.dense import edge_index_to_mask, mask_to_edge_index
from hiergraph.masks.equivariance import (
    automorphisms,
    check_equivariance,
    equivariance_error,
    equivariance_errors,
    is_automorphism,
    relabel,
)
from hiergraph.ops.edge_index import check_edge_index  # re-exported: the masks' input check

__all__ = [
    "BandMask",
    "automorphisms",
    "block_diagonal_mask",
    "causal_mask",
    "check_edge_index",
    "check_equivariance",
    "cross_mask",
    "dilated_mask",
    "edge_index_to_mask",
    "equivariance_error",
    "equivariance_errors",
    "full_mask",
    "global_tokens_mask",
    "graph_mask",
    "is_automorphism",
    "mask_to_edge_index",
    "random_mask",
    "relabel",
    "sequence_batch",
    "sibling_mask",
    "window_mask",
]
