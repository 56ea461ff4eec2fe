r"""Dense reference for strictly causal HSA (:func:`~hiergraph.ops.causal_hierarchical_attention`).

Row :math:`i` is row :math:`i` of the dense left-masked, self-including HSA
matrix of the tree restricted to the leaves :math:`j \le i`
(:func:`~hiergraph.ops.hierarchical_attention_matrix` with a leaf mask): one
independent dense evaluation per row, :math:`O(H L^3 \cdot \text{depth})` in
Python loops. For tests on small trees only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hiergraph.ops.hsa.dense import hierarchical_attention_matrix


def causal_hierarchical_attention_matrix(
    q: Tensor, k: Tensor, hierarchy, *, pos_emb: Tensor | None = None, scale: float | None = None
) -> Tensor:
    r"""The dense causal HSA matrix :math:`\hat\Theta^{c}` (``[H, L, L]``).

    :math:`\hat\Theta^{c}_{i\cdot} = \hat\Theta^{L}(T_{\le i})_{i\cdot}`: the
    prefix tree's causal HSA row, built by masking out the leaves after ``i``.

    Args:
        q, k: ``[L, H, d]`` queries and keys in leaf order (``[L, d]`` is treated as one
            head).
        hierarchy: a :class:`~hiergraph.data.SignalHierarchy`, a PyG batch of them, or a
            graph with its community tree, as in
            :func:`~hiergraph.ops.hierarchical_attention_matrix`.
        pos_emb: optional ``[N, c]``, ``[N, 1, c]`` or ``[N, H, c]`` position embedding
            :math:`\varepsilon` of every tree node (node order).
        scale: logit scale :math:`\tau`, default :math:`1/\sqrt{d}`.

    Returns:
        ``[H, L, L]`` (``[1, L, L]`` for 2-D inputs), zero above the diagonal.
    """
    if q.dim() == 2:
        q, k = q.unsqueeze(1), k.unsqueeze(1)
    num_leaves = q.size(0)
    ar = torch.arange(num_leaves)
    rows = []
    for i in range(num_leaves):
        theta = hierarchical_attention_matrix(
            q, k, hierarchy, pos_emb=pos_emb, include_self=True, leaky_causal=True,
            leaf_mask=ar <= i, scale=scale,
        )  # fmt: skip
        rows.append(theta[:, i])
    return torch.stack(rows, dim=1)
