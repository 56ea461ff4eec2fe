r"""Family attention of one level as a softmax over sibling pairs: the general reference path
of the sibling attention of :mod:`~hiergraph.ops.hsa.family`, over any forest.

:func:`family_attention_edge` takes the list of sibling pairs ``(C, B)`` of a level
(``level.sibling_pairs``, ``[P]`` each), the logit :math:`s(C, B)` ``[P, H]`` of every
pair from the rows ``[n, H, d]`` of both, a scatter softmax over the pairs of every query
(``lse [n, H]``) and a scatter of the weighted values (``theta [n, H, d_v]``): the contract
of :func:`~hiergraph.ops.hsa.family_dense.family_attention_dense`, at the cost of the
gathered pairs' rows. On the CPU the softmax is one call of the compiled kernel
(:func:`~hiergraph.ops.hsa.native.edge_softmax`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch_geometric.utils import scatter

from hiergraph.ops.hsa import native
from hiergraph.ops.hsa.family import key_bias
from hiergraph.ops.logspace import scatter_softmax
from hiergraph.ops.runs import sum_children
from hiergraph.plan.level import Level


def family_attention_edge(
    level: Level,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    eps: Tensor | None,
    count: Tensor,
    tau: float,
    *,
    left_only: bool,
    parent_level: Level,
    size_bias: bool = True,
) -> tuple[Tensor, ...]:
    """Family attention of one level as a softmax over sibling pairs (same contract as
    :func:`~hiergraph.ops.hsa.family_dense.family_attention_dense`): on the CPU one call of
    the compiled kernel (:func:`~hiergraph.ops.hsa.native.edge_softmax`, over the pairs whose
    key has leaves; second derivatives through the tensor operations below), elsewhere
    gathers of every pair's rows, a scatter softmax and a scatter of the weighted values.

    Its inputs are float32 or float64 (the general path widens bf16/fp16 ones,
    :func:`~hiergraph._precision.widened`). The rows of the pairs are gathered with
    ``index_select``, whose backward adds them in pair order (bitwise reproducible on CPU;
    ``x[index]`` would add them with unordered atomics)."""
    n = count.numel()
    query, key = level.sibling_pairs
    bias, ok = key_bias(count, size_bias, q.dtype)
    keep = ok[key] & (key < query) if left_only else ok[key]  # the pairs that attend

    def pairs(q, k, v, eps):
        logits = tau * (q.index_select(0, query) * k.index_select(0, key)).sum(-1)
        if eps is not None:
            logits = logits + (eps.index_select(0, query) * eps.index_select(0, key)).sum(-1)
        logits = (logits + bias[key].unsqueeze(-1)).masked_fill(~keep.unsqueeze(-1), -math.inf)
        lse, attn = scatter_softmax(logits, query, n)
        weighted = attn.unsqueeze(-1) * v.index_select(0, key)
        return lse, scatter(weighted, query, 0, dim_size=n, reduce="sum")

    if native.applies_to_edges(q):
        rows = None if eps is None else eps.expand(-1, q.size(1), -1)
        node = torch.arange(n, device=q.device)
        lse, theta = native.edge_softmax(
            q, k, v, bias, rows, node, query[keep], key[keep], tau, recorded=pairs
        )
    else:
        lse, theta = pairs(q, k, v, eps)
    weight = count[:, None, None]
    sums = [sum_children(t * weight, level, parent_level) for t in (q, k, v)]
    return lse, theta, *sums
