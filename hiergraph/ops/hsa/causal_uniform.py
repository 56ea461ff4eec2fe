r"""Strictly causal HSA over forests whose levels have equal fanout, as reshaped views.

The prefix-statistics recurrence of
:func:`~hiergraph.ops.causal_hierarchical_attention` for a forest of shape
``(B, b_1, …, b_D)`` (:attr:`~hiergraph.plan.TreeIndex.uniform`): the leaves below a
depth-:math:`s` node are a run of :math:`N_s = b_{s+1} \cdots b_D` consecutive
leaves, so for leaf :math:`i` and its depth-:math:`s` ancestor :math:`A_s`

* the prefix sum :math:`\sum_{j \le i,\, j \in A_s} q_j` is a cumulative sum over
  that run, and the prefix count :math:`n_i(A_s)` is ``i mod N_s + 1``. The sum is never
  formed: the logits are linear in it, so the leaves' own logits against :math:`A_s`'s
  siblings are summed over each prefix within the deepest family (a small product with a
  lower-triangular matrix of ones, several times faster than ``cumsum``), and the rest of
  the prefix, the sums of the left siblings of the ancestors :math:`A_{s+1}, \dots`
  below :math:`A_s` (their means times their counts, exclusive cumulative sums over each
  family of the bottom-up pass's means), is the same for a whole deepest family and adds
  one row of logits per family;
* the keys are the left siblings of :math:`A_s`, complete sub-trees whose means
  :math:`\rho_k, \rho_v`, counts :math:`N_s` and values :math:`g(B)` are those of the
  paper's sibling-masked HSA (App. G.1), computed once for every node by the
  bottom-up pass of :mod:`hiergraph.ops.hsa.uniform`;
* the energy :math:`a_i(A_s) = \big(N_{s+1} \sum_{B \in \mathrm{sib}_L(A_{s+1})} g(B)
  + n_i(A_{s+1})\, g_i(A_{s+1})\big) / n_i(A_s)` takes the left siblings' sum as an
  exclusive cumulative sum over each family.

The ancestors' keys and values are small (one row per sibling), so those of every depth
are gathered for each family of the deepest ancestor level: one product gives every leaf's
logits against all its ancestors' siblings, and one the ancestors' share of its output. So
the whole op costs a fixed handful of batched operations over all leaves, trees and heads
(two products over the leaves' queries and values, per depth a softmax over ``b_s`` logits
per leaf), with no gathers, scatters or host synchronisation; the result equals the
edge-list op to rounding and is differentiable twice. On the CPU, leaf families of
:data:`~hiergraph.ops.hsa.family_fused.WIDE_LEFT_LEAVES` or more leaves run in PyTorch's
fused attention kernel (:func:`~hiergraph.ops.hsa.family_fused.leaf_family_attention`),
which hands back their :math:`\vartheta` instead of their weights: their logits are never
stored.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from hiergraph.ops.hsa import family_fused
from hiergraph.ops.hsa.family_products import summed_products
from hiergraph.ops.hsa.heads_first import (
    family_layout,
    heads_first,
    like,
    node_layout,
    tie_leaves,
)
from hiergraph.ops.hsa.uniform import bottom_up, counts_below
from hiergraph.ops.logspace import log_gates, logaddexp, softmax_dropping


def uniform_causal_attention(
    q: Tensor, k: Tensor, v: Tensor, shape: tuple[int, ...], eps: list[Tensor] | None, tau: float
) -> Tensor:
    r"""Strictly causal HSA of ``q, k [L, H, d]``, ``v [L, H, d_v]`` (leaf order = the
    breadth-first order of the last level) over an equal-fanout forest ``shape``.

    Args:
        eps: optional position embeddings per depth ``1 … D``, each ``[H | 1, n_s, c]``
            in breadth-first order (:func:`~hiergraph.ops.hsa.heads_first.per_depth`).
        tau: the logit scale.

    Returns:
        ``[L, H, d_v]``.
    """
    fanout = shape[1:]
    depth, num_leaves = len(fanout), q.size(0)
    tie_leaves(shape, q, k, v)
    below = counts_below(None, fanout)  # N_s of the nodes at depth s = d + 1
    leaves = [heads_first(t) for t in (q, k, v)]  # [H, L, ·]: see hiergraph.ops.hsa.heads_first
    leaf_rho = [family_layout(t, fanout[-1]) for t in leaves]
    # complete statistics of every node: the sibling-masked (leaky) pass; wide leaf
    # families in the fused kernel, which hands back theta instead of the weights
    fused = fanout[-1] >= family_fused.WIDE_LEFT_LEAVES and family_fused.fused_kernel_applies(q)
    lses, probs, gates, rhos, _ = bottom_up(
        leaf_rho, below, fanout, eps, tau, include_self=True, left_only=True, size_bias=True,
        fused_leaves=fused,
    )  # fmt: skip
    leaf_energy = gates[-1]
    position = torch.arange(num_leaves, device=q.device)
    # n_i(A_s), leaf i's prefix count within its depth-s ancestor, for s = 1 .. D - 1
    prefix = [(position % n + 1).to(q.dtype) for n in below[:-1]]

    # per depth s = D .. 1 (index d = s - 1): the prefix attention of every leaf's ancestor;
    # a leaf is its own prefix, so the leaf level is the leaky pass's
    # (only the weights p are kept: theta = p @ values is never formed, the top-down gains
    # scale p)
    lse, probs_at = [None] * depth, [None] * depth
    lse[-1] = node_layout(lses[-1])
    raw = _ancestor_logits(leaves[0], rhos, fanout)
    offsets = _prefix_offsets(rhos, fanout, below)
    for d in range(depth - 2, -1, -1):
        lse[d], probs_at[d] = _prefix_attention(
            raw[d], offsets[d], prefix[d], rhos[d][1], eps, d, below[d], fanout[-1], tau
        )

    # energies along each leaf's path, bottom-up: a_i(A_s) from the child's g_i(A_{s+1})
    a = [None] * depth
    a[-1] = node_layout(leaf_energy)
    for d in range(depth - 2, -1, -1):
        n_child = below[d + 1]
        child_g = logaddexp(a[d + 1], lse[d + 1], finite_a=True)  # no mask: finite energies
        complete_g = logaddexp(gates[d + 1], lses[d + 1], finite_a=True)  # [H, F, b]
        # exclusive cumulative sum per family (not cumsum - g: rounding would then depend
        # on g of the ancestor itself, which later leaves change)
        left_g = node_layout(F.pad(complete_g[..., :-1].cumsum(-1), (1, 0)))
        left_g = left_g.repeat_interleave(n_child, 1) if n_child > 1 else left_g
        n_i_child = prefix[d + 1] if d + 2 < depth else 1  # the child a leaf: n_i = 1
        a[d] = (n_child * left_g + n_i_child * child_g) / prefix[d]

    # top-down: gates along the root path; a row's gain scales its [b] weights. The
    # leaves' own weights exp(u) go onto the diagonal of their families' weights (left
    # siblings only: that diagonal is 0), so the last product adds them. The ancestors'
    # weights and values are gathered by the deepest ancestor family, as their logits
    # were: one product for all of them, plus the leaves' (accumulated in one buffer)
    u, ancestors = None, []
    for d in range(depth):
        log_mu, log_rest = log_gates(a[d], lse[d], finite=True)
        gain = torch.exp(log_rest if u is None else u + log_rest)
        p = probs[-1] if d + 1 == depth else probs_at[d]  # [H, F, m, b], F * m = L
        p = gain.view(*p.shape[:3], 1) * p
        u = log_mu if u is None else u + log_mu
        if d + 1 < depth:
            ancestors.append(p)
    own, terms, leaf_out = torch.exp(u).view(p.shape[:3]), [], None
    if fused:  # p is the leaves' gained theta: add their own weighted values
        leaf_out = node_layout(torch.addcmul(p, own.unsqueeze(-1), rhos[-1][2]))
    else:
        terms.append((p + torch.diag_embed(own), rhos[-1][2]))
    if ancestors:
        values = _by_deepest_family([rho[2] for rho in rhos[:-1]])
        rows = num_leaves // values.size(1)  # leaves below a deepest ancestor family
        weights = _cat([family_layout(node_layout(w), rows) for w in ancestors], -1)
        terms.insert(0, (weights, values))
    if not terms:  # one level of fused leaf families
        return like(leaf_out, q)
    out = summed_products(terms)
    return like(out if leaf_out is None else out + leaf_out, q)


def _cat(xs: list[Tensor], dim: int) -> Tensor:
    """``torch.cat`` that returns a single tensor as it is (no copy)."""
    return xs[0] if len(xs) == 1 else torch.cat(xs, dim)


def _by_deepest_family(xs: list[Tensor]) -> Tensor:
    """Per-depth family statistics ``xs`` (``d = 0 … D - 2``, ``[H, F_d, b_d, c]``) for
    every family of the deepest of those levels (``F_{D-2}`` of them, nested in the
    others: each sees its ancestors' families), concatenated: ``[H, F_{D-2}, b_0 + … +
    b_{D-2}, c]``."""
    families = xs[-1].size(1)
    xs = [x if x.size(1) == families else x.repeat_interleave(families // x.size(1), 1) for x in xs]
    return _cat(xs, 2)


def _prefix_offsets(rhos: list, fanout: tuple[int, ...], below: list[int]) -> list:
    r"""Per depth index ``d = 0 … D - 2``, the part of every leaf's prefix sum within its
    depth-``d + 1`` ancestor that lies outside its own family of leaves: ``[H, n_{D-1},
    d_q]``, one row per depth-:math:`D - 1` node (the parent of a leaf family), or
    ``None`` for ``d = D - 2`` (the whole prefix then lies in the leaf's family).

    The prefix of leaf :math:`i` within :math:`A_{d+1}` is its prefix within its family
    plus, for every depth :math:`e = d + 2 … D - 1`, the complete sums
    :math:`N_e \rho_q(B)` of the left siblings :math:`B` of :math:`A_e(i)`: an exclusive
    cumulative sum over each family of the bottom-up pass's means (``pad`` then
    ``cumsum``: no term of a later sibling is ever added). Those depend on the leaf's
    family only, so they are held per family, not per leaf (``rhos``: the bottom-up
    pass's means in family layout)."""
    depth = len(fanout)
    offsets = [None] * max(depth - 1, 0)
    for d in range(depth - 3, -1, -1):
        n_child = below[d + 1] // fanout[-1]  # leaf families below a node of depth d + 2
        child = rhos[d + 1][0] * below[d + 1]  # [H, F, b, d_q]: complete sums of the children
        left = node_layout(F.pad(child[:, :, :-1].cumsum(2), (0, 0, 1, 0)))
        offset = (
            left.unsqueeze(2)
            if offsets[d + 1] is None
            else (family_layout(offsets[d + 1], n_child) + left.unsqueeze(2))
        )
        offsets[d] = node_layout(offset.expand(-1, -1, n_child, -1))
    return offsets


def _ancestor_logits(q: Tensor, rhos: list, fanout: tuple[int, ...]) -> list:
    r"""Per depth index ``d = 0 … D - 2``, the logits ``[H, F_d, span_d, b_d]`` of every
    leaf's prefix within its leaf family (``q [H, L, d_q]``) against the siblings of its
    depth-``d + 1`` ancestor (``rhos[d]``'s keys), unscaled: the raw logits
    :math:`q_j^\top \rho_k(B)` summed over each prefix.

    The keys of all those depths are gathered for every family of the deepest of them
    (``[H, F_{D-2}, b_0 + … + b_{D-2}, d_k]``, small), so one product reads the leaves' queries
    for all depths and its backward writes their gradient once; the prefix sums are a
    product with ``tril(ones)`` whose zero entries add exact zeros (finite later leaves
    do not change an earlier row by a bit; a non-finite one would reach the earlier rows
    of its family as ``0 * inf = nan``). The per-depth results are views."""
    depth, b_leaf = len(fanout), fanout[-1]
    if depth < 2:
        return []
    keys = _by_deepest_family([rho[1] for rho in rhos[:-1]])
    logits = torch.matmul(family_layout(q, q.size(1) // keys.size(1)), keys.transpose(-1, -2))
    tril = torch.ones(b_leaf, b_leaf, dtype=q.dtype, device=q.device).tril()
    logits = torch.matmul(tril, logits.unflatten(2, (-1, b_leaf))).flatten(2, 3)
    out, start = [], 0
    for rho in rhos[:-1]:
        families, b = rho[1].shape[1:3]
        span = q.size(1) // families  # leaves below a family of that depth (a view)
        out.append(family_layout(node_layout(logits[..., start : start + b]), span))
        start += b
    return out


def _prefix_attention(raw, offset, count, keys, eps, d, n_s, b_leaf, tau):
    r"""``lse [H, L]`` and the weights ``p [H, F, span, b]`` of every leaf's prefix query
    (the mean of its prefix within its depth-``d + 1`` ancestor: ``count [L]`` queries)
    over the left siblings of that ancestor, whose family's complete keys are ``keys [H,
    F, b, d_k]``.

    The prefix sums are never formed: the logits are linear in them, so they are the
    leaves' own logits summed over each prefix within their family (``raw``, see
    :func:`_ancestor_logits`) plus, for the part of the prefix outside the family
    (``offset [H, L / b_leaf, d_q]`` or ``None``, see :func:`_prefix_offsets`), one row
    of logits per family. That is ``b`` numbers per leaf, not ``d_q``. The mean's
    division scales the ``[b]`` logits of a row."""
    b = keys.size(2)
    span = b * n_s  # leaves below one family
    logits = raw
    if offset is not None:
        extra = torch.matmul(family_layout(offset, span // b_leaf), keys.transpose(-1, -2))
        logits = (raw.unflatten(2, (-1, b_leaf)) + extra.unsqueeze(3)).flatten(2, 3)
    logits = logits * (tau / count).view(1, -1, span, 1)
    if eps is not None:  # eps(A_s)^T eps(B) of the ancestor's row, one row per leaf
        e = family_layout(eps[d], b)
        pos = torch.matmul(e, e.transpose(-1, -2))
        logits = logits + pos.repeat_interleave(n_s, 2) if n_s > 1 else logits + pos
    member = torch.arange(span, device=keys.device) // n_s  # the ancestor's slot
    # [span, b]: keys at or right of the ancestor's slot are left out (a first child: all)
    lse, p = softmax_dropping(
        logits, torch.arange(b, device=keys.device)[None, :] >= member[:, None]
    )
    if n_s > 1:  # log n(B) = log N_s for every (complete) left sibling
        lse = lse + math.log(n_s)
    return node_layout(lse), p
