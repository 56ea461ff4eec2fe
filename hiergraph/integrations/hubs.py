r"""Hub tokens for zero-shot HSA: the keys every query attends to, lifted to the root.

Late layers of a pretrained encoder send much of *every* query's attention to
the same few keys ("hubs": ``[CLS]``, ``[SEP]``, the topic words of a text; in
all-MiniLM-L6-v2's last layer the top 5% of keys take 36% of all attention
mass). Over a fixed window hierarchy a distant hub is only seen through the
mean value of its window, so HSA spreads that mass over the window and the
error is the same for every query of a block: it survives mean pooling.

A *hub hierarchy* keeps the windows over the other tokens and hangs the
:math:`g` hub tokens directly under the root, as single leaves, so every
block sees each hub's own key and value. HSA over it is still exact HSA
(Thm. 3.2) over a tree; only the tree depends on the input. Hubs are the keys
with the largest root-level score, the quantity HSA's root family already
uses for a leaf :math:`j`,

.. math::
    s_j = \operatorname{logsumexp}_h \big(\tau\, \bar q_h^\top k_{j,h}\big),
    \qquad \bar q_h = \frac{1}{N} \sum_i q_{i,h},

at a cost of :math:`H\,(N d + 2 N d)` FLOPs (:func:`hub_selection_flops`),
linear in :math:`N`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from hiergraph._checks import check_int
from hiergraph._precision import accumulation_dtype
from hiergraph.data.signal_hierarchy import SignalHierarchy, as_long
from hiergraph.data.windows import window_forest, window_hierarchy
from hiergraph.integrations.padded_attention import check_padded, nonempty_lengths


def hub_scores(q: Tensor, k: Tensor, token_mask: Tensor, scale: float | None = None) -> Tensor:
    r"""``[B, T]`` root-level scores :math:`s_j` of every key (``-inf`` at padding), in float32
    for half-precision ``q, k``: :func:`~hiergraph.ops.hsa.hubs.root_scores` of every
    example, computed on the padded batch (one masked sum for the mean queries, one
    multiply-and-sum over the keys for the logits).

    Args:
        q (torch.Tensor): queries ``[B, H, T, d]``.
        k (torch.Tensor): keys ``[B, H, T, d]``.
        token_mask (torch.Tensor): ``[B, T]`` bool, ``True`` for real tokens.
        scale (float, optional): logit scale :math:`\tau`. (default: :obj:`None`,
            i.e. :math:`1/\sqrt{d}`)
    """
    check_padded(q, k, k, token_mask)  # (a long mask, a short one: errors deep inside)
    return checked_hub_scores(q, k, token_mask, scale)


def checked_hub_scores(q: Tensor, k: Tensor, token_mask: Tensor, scale: float | None) -> Tensor:
    """:func:`hub_scores` of inputs a caller has checked already
    (:func:`~hiergraph.integrations.padded_attention.check_padded`)."""
    scale = q.size(-1) ** -0.5 if scale is None else scale
    dtype = accumulation_dtype(q.dtype)
    weight = token_mask.to(dtype)  # [B, T]
    count = weight.sum(1).clamp(min=1)[:, None, None]
    q, k = q.to(dtype), k.to(dtype)
    # one pass over q and over k in their own memory, whichever their layout: token-major
    # (views of [B, T, H, d], as a Hugging Face layer's heads are) as a product over [T, H d]
    # rows per example and a broadcast product and sum; heads first as products per example
    # and head (each form would copy the other layout first)
    if _token_major(q):
        q_mean = torch.einsum("bt,bhtd->bhd", weight, q) / count  # [B, H, d]
    else:
        q_mean = torch.matmul(weight[:, None, None, :], q).squeeze(2) / count
    if _token_major(k):
        logits = (k.transpose(1, 2) * q_mean.unsqueeze(1)).sum(-1).transpose(1, 2)
    else:
        logits = torch.matmul(k, q_mean.unsqueeze(-1)).squeeze(-1)  # [B, H, T]
    return logits.mul_(scale).logsumexp(1).masked_fill(~token_mask, float("-inf"))


def _token_major(x: Tensor) -> bool:
    """Whether ``[B, H, T, d]`` ``x`` is a view of contiguous ``[B, T, H, d]``."""
    return x.transpose(1, 2).is_contiguous()


def select_hubs(scores: Tensor, token_mask: Tensor, hubs: int) -> Tensor:
    """``[L]`` bool over the valid tokens of every example (in example order, the leaf order
    of :func:`hub_window_hierarchies`): ``True`` for its ``hubs`` best-scoring tokens, at
    most ``n - 1`` for ``n`` valid tokens, so the windows keep one token.

    Args:
        scores (torch.Tensor): ``[B, T]``, e.g. from :func:`hub_scores`.
        token_mask (torch.Tensor): ``[B, T]`` bool, ``True`` for real tokens.
        hubs (int): hubs per example.
    """
    return lifted_tokens(scores, token_mask, hubs)[token_mask]


def lifted_tokens(scores: Tensor, token_mask: Tensor, hubs: int) -> Tensor:
    """:func:`select_hubs` on the padded batch: ``[B, T]`` bool, ``True`` for the hubs."""
    check_int(hubs, "hubs", minimum=0)  # (1.5 failed in topk)
    n = token_mask.sum(1)
    top = scores.topk(min(hubs, scores.size(1)), dim=1).indices  # [B, g], best first
    keep = torch.arange(top.size(1), device=top.device) < (n - 1).clamp(min=0)[:, None]
    return torch.zeros_like(token_mask).scatter_(1, top, keep)


def hub_window_hierarchy(
    num_tokens: int, branching: Sequence[int], hubs: Tensor | Sequence[int]
) -> SignalHierarchy:
    """Windows over the tokens that are not hubs, and every hub a leaf under the root.

    Leaves stay in token order (leaf ``i`` is token ``i``), so the tree plugs into
    :func:`~hiergraph.integrations.padded_hsa` like :func:`~hiergraph.data.window_hierarchy`.
    With no hubs it is exactly ``window_hierarchy(num_tokens, branching)``; the rules
    for the root family are those of :func:`~hiergraph.data.windows.window_forest`.

    Args:
        num_tokens (int): ``n >= 1`` tokens.
        branching (Sequence[int]): bottom-up window sizes of the windows over the
            ``n - g`` others.
        hubs (torch.Tensor or Sequence[int]): ``g < n`` distinct token indices in
            ``[0, n)``.
    """
    hubs = as_long(hubs, "hubs").cpu().flatten()
    lifted = torch.zeros(num_tokens, dtype=torch.bool)
    if hubs.numel():
        if int(hubs.min()) < 0 or int(hubs.max()) >= num_tokens:
            raise ValueError(f"hub indices must be in [0, {num_tokens}), got {hubs.tolist()}")
        lifted[hubs] = True
        if int(lifted.sum()) != hubs.numel():
            raise ValueError(f"hub indices must be distinct, got {hubs.tolist()}")
        if bool(lifted.all()):
            raise ValueError(f"at most {num_tokens - 1} hubs for {num_tokens} tokens")
    return window_hierarchy(num_tokens, branching, lifted=lifted)


def hub_window_hierarchies(
    lengths: Sequence[int], branching: Sequence[int], lifted: Tensor
) -> SignalHierarchy:
    """One forest of :func:`hub_window_hierarchy` trees, one per non-empty example, built
    in one vectorised step (:func:`~hiergraph.data.windows.window_forest`).

    Args:
        lengths (Sequence[int]): valid tokens per example.
        branching (Sequence[int]): bottom-up window sizes.
        lifted (torch.Tensor): ``[sum(lengths)]`` bool, ``True`` = hub, as
            :func:`select_hubs` returns them.
    """
    lengths = nonempty_lengths(lengths)
    if lifted.shape != (sum(lengths),):
        raise ValueError(
            f"lifted must have one entry per valid token ({sum(lengths)}), got "
            f"{tuple(lifted.shape)}"
        )
    return window_forest(lengths, branching, lifted=lifted.cpu())


def hub_selection_flops(num_tokens: int, head_dim: int, heads: int = 1) -> int:
    r"""FLOPs of :func:`hub_scores` for one example: the mean query and one dot product per
    key and head, :math:`H (N d + 2 N d)` (the top-:math:`g` selection is not counted).

    Args:
        num_tokens (int): valid tokens :math:`N` of the example.
        head_dim (int): query/key width :math:`d` per head.
        heads (int, optional): number of heads :math:`H`. (default: :obj:`1`)
    """
    check_int(num_tokens, "num_tokens", minimum=0)
    check_int(head_dim, "head_dim")
    check_int(heads, "heads", minimum=0)
    return heads * 3 * num_tokens * head_dim
