r"""Hub leaves: the keys a whole tree attends to, chosen per tree in :math:`O(L\,d)`.

HSA sees a leaf outside a query's own family only through the mean key and
value of the block it sits in (Thm. 3.2), so a single salient key far away (a
topic word three sentences on) gets ``1 / n(B)`` of its block's mass. Lifting
a few such leaves to the root (:func:`~hiergraph.data.restructure.lift_leaves`)
lets every query weigh them one by one. The leaves are chosen by the score the
root family would give them,

.. math::
    s_j = \operatorname{logsumexp}_h \big(\tau\, \bar q_{t(j),h}^\top k_{j,h}\big),
    \qquad \bar q_{t,h} = \operatorname{mean}_{i \in t}\, q_{i,h},

the logits of the tree's mean query (:math:`t(j)`: the tree of leaf :math:`j`),
and the ``hubs`` best of every tree are lifted (all of them in trees of at most
``hubs`` leaves, which then get flat softmax attention). The choice is a
discrete step: no gradient flows through it.
"""

from __future__ import annotations

import operator

import torch
from torch import Tensor

from hiergraph._checks import check_int, holds_integers
from hiergraph._deprecation import renamed_arguments
from hiergraph._precision import accumulation_dtype
from hiergraph.ops.topk import top_k_per_group


def root_scores(
    q: Tensor,
    k: Tensor,
    tree: Tensor | int,
    leaf_mask: Tensor | None = None,
    *,
    scale: float | None = None,
) -> Tensor:
    r"""``[L]`` scores :math:`s_j` of every leaf (``-inf`` at masked leaves).

    The mean query and the scores are computed, and returned, in float32 for
    half-precision inputs (float64 stays float64): in bf16 a leaf count stops at
    256 and in fp16 a sum of queries overflows, which would change or NaN the
    hub choice.

    Args:
        q, k: ``[L, H, d]`` leaf queries and keys, in leaf order.
        tree: ``[L]`` tree id of every leaf (ids ``< L``, as when every tree has a leaf),
            or the number of trees when they have the same number of leaves and follow
            one another (a batch of equal trees): the means are then taken over views.
        leaf_mask: ``[L]`` bool, ``False`` for padding leaves (not averaged, never chosen).
        scale: :math:`\tau`, default :math:`1/\sqrt{d}`.

    Returns:
        ``[L]`` in ``torch.promote_types(q.dtype, torch.float32)``.
    """
    if q.dim() != 3 or k.shape != q.shape:
        raise ValueError(
            f"q and k must be [L, H, d] with the same shape, got {tuple(q.shape)} and "
            f"{tuple(k.shape)}"
        )
    tree = _checked_tree(tree, q.size(0), q.device)
    scale = q.size(-1) ** -0.5 if scale is None else scale
    dtype = accumulation_dtype(q.dtype)
    q, k = q.to(dtype), k.to(dtype)
    w = q.new_ones(q.size(0)) if leaf_mask is None else leaf_mask.to(dtype)
    if isinstance(tree, int):  # equal trees in order: [T, n, H, d] views
        n = q.size(0) // tree
        total = torch.matmul(w.view(tree, 1, n), q.reshape(tree, n, -1))  # [T, 1, H d]
        count = w.view(tree, n).sum(1).clamp(min=1)
        q_mean = (total / count[:, None, None]).view(tree, 1, *q.shape[1:])
        logits = (k.reshape(tree, n, *k.shape[1:]) * q_mean).sum(-1).flatten(0, 1)  # [L, H]
    else:
        # one row per leaf (every tree has a leaf, so ids < L): no host read of the tree count
        total = torch.zeros_like(q).index_add_(0, tree, q * w[:, None, None])
        count = q.new_zeros(q.size(0)).index_add_(0, tree, w).clamp(min=1)
        q_mean = total / count[:, None, None]  # [T, H, d]
        logits = (q_mean.index_select(0, tree) * k).sum(-1)
    s = logits.mul(scale).logsumexp(-1)
    return s if leaf_mask is None else s.masked_fill(~leaf_mask, float("-inf"))


@renamed_arguments(g="hubs")
def top_per_tree(scores: Tensor, tree: Tensor | int, hubs: int) -> Tensor:
    """``[L]`` bool: the ``hubs`` highest finite ``scores`` of every tree (ties: lower
    index); no gradient (a discrete choice).

    Args:
        scores: ``[L]`` leaf scores, e.g. from :func:`root_scores`; a leaf whose score is
            not finite (``-inf`` at masked leaves) is never chosen.
        tree: ``[L]`` integer tree id of every leaf, on the device of ``scores``, or the
            number of equal trees that follow one another, as in :func:`root_scores` (a
            count of equal trees: one sort per tree's row).
        hubs: leaves chosen per tree, ``>= 0`` (formerly ``g``); a tree with at most
            ``hubs`` finite scores has all of them chosen.
    """
    check_int(hubs, "hubs", minimum=0)
    tree = _checked_tree(tree, scores.size(0), scores.device)
    if isinstance(tree, int):
        rows = scores.view(tree, -1)
        best = torch.sort(rows, dim=1, descending=True, stable=True).indices[:, :hubs]
        chosen = torch.zeros_like(rows, dtype=torch.bool).scatter_(1, best, True).view(-1)
    else:
        chosen = top_k_per_group(scores, tree, hubs)
    return chosen & torch.isfinite(scores)


def _checked_tree(tree: Tensor | int, num_leaves: int, device: torch.device) -> Tensor | int:
    """``tree`` (a count of equal trees as a Python int, e.g. from a NumPy one), refused
    unless it is a count that divides the ``num_leaves`` leaves or a ``[num_leaves]``
    integer tensor of tree ids on ``device`` (the ids themselves are not read: no host
    synchronisation)."""
    if isinstance(tree, Tensor):
        if not holds_integers(tree) or tree.shape != (num_leaves,) or tree.device != device:
            raise ValueError(
                f"tree must be a [{num_leaves}] integer tensor of tree ids on {device}, got "
                f"{tree.dtype} {tuple(tree.shape)} on {tree.device}"
            )
        return tree
    check_int(tree, "tree (a count of equal trees)")
    if num_leaves % tree:
        raise ValueError(f"tree={tree} equal trees cannot share {num_leaves} leaves equally")
    return operator.index(tree)
