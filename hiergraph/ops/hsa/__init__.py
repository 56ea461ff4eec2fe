r"""Hierarchical Self-Attention (HSA) over signal hierarchies.

Amizadeh et al., *Hierarchical Self-Attention: Generalizing Neural Attention
Mechanics to Multi-Scale Problems*: every node attends to its siblings over pooled
statistics (App. E.3), and the exact attention of every leaf is assembled by a
two-pass dynamic program over the tree (Alg. 1–3, App. E). Modules:

* :mod:`~hiergraph.ops.hsa.attention`: the fast path,
  :func:`~hiergraph.ops.hierarchical_attention`, which chooses how a forest runs:
  :mod:`~hiergraph.ops.hsa.uniform` runs it as reshaped views on forests whose levels
  have equal fanout (:mod:`~hiergraph.ops.hsa.uniform_fused`: both passes as one
  autograd node with a written backward; :mod:`~hiergraph.ops.hsa.heads_first`: the
  heads-first storage of its levels and their node and family layouts;
  :mod:`~hiergraph.ops.hsa.token_layout`: its leaf level read in the inputs' own
  ``[L, H, d]`` memory, without layout copies),
  :mod:`~hiergraph.ops.hsa.padded` on nearly equal forests padded to equal fanout, and
  the sibling-attention kernels of any other forest:
  :mod:`~hiergraph.ops.hsa.family_dense` (dense blocks) and
  :mod:`~hiergraph.ops.hsa.family_edge` (sibling pairs);
* sibling attention's building blocks: :mod:`~hiergraph.ops.hsa.family` (its logits and
  the terms its kernels and the equal-fanout paths share),
  :mod:`~hiergraph.ops.hsa.family_fused` (families in PyTorch's fused CPU attention
  kernel) and :mod:`~hiergraph.ops.hsa.family_products` (the batched products over
  families they are made of);
* kernels: :mod:`~hiergraph.ops.hsa.native`, the compiled CPU kernel (equal-fanout,
  padded and ragged forests, hub trees, the strictly causal op, the KV cache's decoding
  step), and :mod:`~hiergraph.ops.hsa.triton_uniform` with
  :mod:`~hiergraph.ops.hsa.triton_kernels`, the opt-in GPU kernels of equal fanout;
* :mod:`~hiergraph.ops.hsa.lifted`: HSA over a tree whose hub leaves hang under the root,
  on the original tree's plan;
* :mod:`~hiergraph.ops.hsa.dense`: the dense reference,
  :func:`~hiergraph.ops.hierarchical_attention_matrix` and the energy
  :func:`~hiergraph.ops.hierarchy_energy`;
* :mod:`~hiergraph.ops.hsa.causal` (fast path, with
  :mod:`~hiergraph.ops.hsa.causal_uniform` for equal fanout) and
  :mod:`~hiergraph.ops.hsa.causal_dense` (dense reference): strictly causal HSA from
  prefix statistics (App. G);
* helpers: :mod:`~hiergraph.ops.hsa.inputs` (the input checks) and
  :mod:`~hiergraph.ops.hsa.hubs` (the choice of the hub leaves lifted to each tree's root).
"""

from hiergraph.ops.hsa.attention import hierarchical_attention
from hiergraph.ops.hsa.causal import causal_hierarchical_attention
from hiergraph.ops.hsa.causal_dense import causal_hierarchical_attention_matrix
from hiergraph.ops.hsa.dense import hierarchical_attention_matrix, hierarchy_energy
from hiergraph.ops.hsa.hubs import root_scores, top_per_tree

__all__ = [
    "causal_hierarchical_attention",
    "causal_hierarchical_attention_matrix",
    "hierarchical_attention",
    "hierarchical_attention_matrix",
    "hierarchy_energy",
    "root_scores",
    "top_per_tree",
]
