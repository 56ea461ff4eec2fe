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
from torch_geometric.data import Batch

from hiergraph.data.signal_hierarchy import SignalHierarchy
from hiergraph.data.windows import window_hierarchy
from hiergraph.ops.hubs import root_scores


def hub_scores(q: Tensor, k: Tensor, key_valid: Tensor, scale: float | None = None) -> Tensor:
    r"""``[B, T]`` root-level scores :math:`s_j` of every key (``-inf`` at padding).

    Args:
        q, k: ``[B, H, T, d]``.
        key_valid: ``[B, T]`` bool, ``True`` for real tokens.
        scale: logit scale :math:`\tau`, default :math:`1/\sqrt{d}`.
    """
    b, h, t, d = q.shape
    tree = torch.arange(b, device=q.device).repeat_interleave(t)
    packed = [x.transpose(1, 2).reshape(b * t, h, d) for x in (q, k)]
    return root_scores(*packed, tree, key_valid.reshape(-1), scale).view(b, t)


def select_hubs(scores: Tensor, key_valid: Tensor, hubs: int) -> list[Tensor]:
    """The ``hubs`` best-scoring valid tokens of every example with valid tokens, as sorted
    indices *among its valid tokens* (the leaf numbering of its tree); at most ``n - 1``
    for ``n`` valid tokens, so the windows keep one token."""
    if hubs < 0:
        raise ValueError(f"hubs must be >= 0, got {hubs}")
    n = key_valid.sum(1)
    top = scores.topk(min(hubs, scores.size(1)), dim=1).indices  # [B, g], best first
    keep = torch.arange(top.size(1), device=top.device) < (n - 1).clamp(min=0)[:, None]
    rank = key_valid.long().cumsum(1) - 1  # position among the valid tokens
    picked = rank.gather(1, top).masked_fill(~keep, scores.size(1)).sort(1).values
    nonempty = n > 0
    counts = keep[nonempty].sum(1).tolist()
    return [row[:c] for row, c in zip(picked[nonempty], counts, strict=True)]


def hub_window_hierarchy(
    num_tokens: int, branching: Sequence[int], hubs: Tensor | Sequence[int]
) -> SignalHierarchy:
    """Windows over the tokens that are not hubs, and every hub a leaf under the root.

    Leaves stay in token order (leaf ``i`` is token ``i``), so the tree plugs into
    :func:`~hiergraph.integrations.padded_hsa` like :func:`~hiergraph.data.window_hierarchy`.
    With no hubs it is exactly ``window_hierarchy(num_tokens, branching)``.

    Args:
        num_tokens: ``n >= 1`` tokens.
        branching: bottom-up window sizes of the windows over the ``n - g`` others.
        hubs: ``g < n`` distinct token indices in ``[0, n)``.
    """
    hubs = torch.as_tensor(hubs, dtype=torch.long).flatten()
    keep = torch.ones(num_tokens, dtype=torch.bool)
    if hubs.numel():
        if int(hubs.min()) < 0 or int(hubs.max()) >= num_tokens:
            raise ValueError(f"hub indices must be in [0, {num_tokens}), got {hubs.tolist()}")
        keep[hubs] = False
        if int(keep.sum()) != num_tokens - hubs.numel():
            raise ValueError(f"hub indices must be distinct, got {hubs.tolist()}")
        if not bool(keep.any()):
            raise ValueError(f"at most {num_tokens - 1} hubs for {num_tokens} tokens")
    rest = keep.nonzero().flatten()
    windows = window_hierarchy(rest.numel(), branching)
    parent = windows.parent  # leaves first; the root is its own parent
    size, m = parent.numel(), rest.numel()
    if hubs.numel() == 0:
        return windows
    if size == 1:  # a single other token: root -> all n tokens (one flat family)
        return SignalHierarchy.from_parent(torch.cat([torch.full((num_tokens,), num_tokens),
                                                      torch.tensor([-1])]))  # fmt: skip
    new_id = torch.cat([rest, num_tokens + torch.arange(size - m)])  # old node -> new node
    root = int((parent == torch.arange(size)).nonzero())
    new_parent = torch.empty(num_tokens + size - m, dtype=torch.long)
    new_parent[new_id] = new_id[parent]
    new_parent[new_id[root]] = -1
    new_parent[hubs] = new_id[root]
    return SignalHierarchy.from_parent(new_parent)


def hub_window_hierarchies(
    lengths: Sequence[int], branching: Sequence[int], hubs: Sequence[Tensor]
) -> Batch:
    """A PyG batch of :func:`hub_window_hierarchy` trees, one per non-empty example
    (``hubs`` as returned by :func:`select_hubs`)."""
    lengths = [int(n) for n in lengths if n > 0]
    if len(lengths) != len(hubs):
        raise ValueError(f"{len(lengths)} non-empty examples but {len(hubs)} hub lists")
    trees = [hub_window_hierarchy(n, branching, h) for n, h in zip(lengths, hubs, strict=True)]
    return Batch.from_data_list(trees)


def hub_selection_flops(num_tokens: int, head_dim: int, heads: int = 1) -> int:
    r"""FLOPs of :func:`hub_scores` for one example: the mean query and one dot product per
    key and head, :math:`H (N d + 2 N d)` (the top-:math:`g` selection is not counted)."""
    return heads * 3 * num_tokens * head_dim
