r"""hiergraph: attention over hierarchical and relational structure for PyTorch Geometric.

Start here
----------
A tree per example is a :class:`~hiergraph.data.SignalHierarchy`; PyG's ``Batch`` batches
them, and :func:`~hiergraph.ops.hierarchical_attention` (or the layer
:class:`~hiergraph.nn.HierarchicalSelfAttention`, the encoder
:class:`~hiergraph.nn.HierarchicalTransformerEncoder`) attends over their leaves::

    import torch
    from hiergraph.data import from_nested
    from hiergraph.ops import hierarchical_attention

    doc = from_nested([[0, 1, 2], [3, 4]])           # 5 tokens in 2 groups
    q = k = v = torch.randn(doc.num_leaves, 4, 16)   # [leaves, heads, d]
    out = hierarchical_attention(q, k, v, doc)       # [5, 4, 16]

The other methods are layers of :mod:`hiergraph.nn`: cone attention (``ConeConv``,
``ConeAttention``), masked attention as message passing (``MaskedAttentionConv``, masks from
:mod:`hiergraph.masks`), H-matrix attention (``HMatrixAttention``, ``HTransformer1D``) and
VCC (``VCCEncoder``). The README's "First run" (``python docs/first_run.py``) trains HSA and
flat attention on generated documents in under a minute (once the CPU kernel is built); the
documentation's guides take each method in turn.

Where things live
-----------------
- :mod:`hiergraph.data`: :class:`~hiergraph.data.SignalHierarchy` (a PyG ``Data`` whose
  nodes are the tree nodes) and its builders (nested specs, windows, documents,
  multimodal records, graph position encodings).
- :mod:`hiergraph.plan`: the structural plan built once per forest and shared by the
  ops (``TreeIndex``, and ``CausalPlan``, a view of it).
- :mod:`hiergraph.ops`: pure tensor functions, each with a dense reference, grouped by
  method: :mod:`hiergraph.ops.hsa` (bidirectional and strictly causal HSA),
  :mod:`hiergraph.ops.hmatrix`, :mod:`hiergraph.ops.cone`, :mod:`hiergraph.ops.masked`
  (banded and edge-list attention kernels), :mod:`hiergraph.ops.vcc` (compression and
  its segment tree); shared helpers beside them (log-space softmaxes, run sums, edge
  checks, top-k).
- :mod:`hiergraph.nn`: the ``nn.Module`` layers built on them (HSA, HTE and its
  decoder, GraphHSAConv, ConeConv, ConeAttention, MaskedAttentionConv,
  HMatrixAttention, HTransformer1D, VCCEncoder, position encoders, pooling, KV caches).
- :mod:`hiergraph.masks`: relational masks as ``edge_index`` (row 0 = key/value
  source, row 1 = query target), band descriptors, dense converters, equivariance tools.
- :mod:`hiergraph.transforms`, :mod:`hiergraph.loader`, :mod:`hiergraph.datasets`:
  graph-to-hierarchy transforms, batching, dataset loaders.
- :mod:`hiergraph.integrations` (imported on demand): zero-shot HSA inside Hugging Face
  encoders, hub tokens, attention FLOP counts.

Vocabulary (the same name means the same thing everywhere)
----------------------------------------------------------
Boolean masks are named for what ``True`` marks:

- ``key_padding_mask``: ``[B, S]``, ``True`` = padding (PyTorch's meaning, as in
  ``nn.MultiheadAttention``; H-matrix attention, ``HTransformer1D``, ``ConeAttention``).
- ``attn_mask``: ``[L, S]``, ``True`` = not allowed (PyTorch's meaning; ``ConeAttention``).
- ``attention_mask``: the mask a Hugging Face layer receives, ``1``/``True`` = attend
  (or additive); :func:`hiergraph.integrations.valid_token_mask` turns it into a
  ``token_mask``.
- ``token_mask``: ``[B, T]``, ``True`` = real (valid) token, ``False`` = padding (VCC,
  the padded zero-shot ops).
- ``leaf_mask``: ``[L]``, ``True`` = valid leaf, ``False`` = padding leaf (HSA, pooling).
- ``vip_mask``: ``[B, n]``, ``True`` = VIP token (VCC).
- a relational mask ``M[query, key]``: ``True`` = the query may attend the key; as an
  ``edge_index`` it is one edge ``key -> query`` per allowed pair.

Other names:

- ``return_attention_weights``: ask a layer for its attention weights too. ``None`` or
  ``False`` returns the output alone, ``True`` returns ``(output, weights)`` (the
  forwards carry ``typing.overload`` signatures for both). ``ConeAttention`` is the one
  exception: as a drop-in for ``nn.MultiheadAttention`` it keeps ``need_weights`` and
  always returns ``(output, weights or None)``.
- ``causal``: ``causal=True`` means strictly causal: a row never depends on later
  tokens.
- ``pos_emb``: position embeddings, one row per tree node (``[N, c]``, or per head
  ``[N, H, c]``), e.g. from :class:`~hiergraph.nn.FamilyPositionEncoder`; siblings get
  the logit bias :math:`\varepsilon(A)^\top\varepsilon(B)`.
- ``hierarchy``: a :class:`~hiergraph.data.SignalHierarchy` or a PyG ``Batch`` of them
  (the ops also take its ``TreeIndex``).
- ``kernel``: which implementation an op runs; every kernel gives the same result.
- memory layout: the ops take ``[L, H, d]`` rows; equal-fanout HSA computes heads first
  and reads ``[H, L, d]`` memory viewed as ``[L, H, d]`` without a copy.
"""

import importlib

from hiergraph import data, loader, masks, nn, ops, plan, runtime, transforms

__version__ = "0.1.0"

#: Subpackages imported on first access (PEP 562): dataset loaders, the Hugging Face
#: integrations and the distributed helpers are not needed to build or run a model.
_LAZY = ("datasets", "distributed", "integrations")

__all__ = [
    "data",
    "datasets",
    "distributed",
    "integrations",
    "loader",
    "masks",
    "nn",
    "ops",
    "plan",
    "runtime",
    "transforms",
    "__version__",
]


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
