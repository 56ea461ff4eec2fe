r"""Exact Hierarchical Self-Attention (HSA) by the normalised two-pass dynamic program.

Amizadeh et al., *Hierarchical Self-Attention: Generalizing Neural Attention
Mechanics to Multi-Scale Problems* (Alg. 1–3); the normalised form of
notes/hsa.md §3.2.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.utils import scatter

from hiergraph.ops.logspace import log_gates, logaddexp, masked_softmax
from hiergraph.ops.tree_index import TreeIndex

KERNELS = ("dense", "edge")


def hierarchical_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    hierarchy,
    *,
    pos_emb: Tensor | None = None,
    include_self: bool = False,
    causal: bool = False,
    leaf_mask: Tensor | None = None,
    scale: float | None = None,
    kernel: str = "dense",
) -> Tensor:
    r"""Hierarchical Self-Attention over a signal hierarchy (or a batch of them).

    For a node :math:`C` with parent :math:`A` and siblings :math:`B`, with
    :math:`n(\cdot)` the number of (valid) leaves below a node and
    :math:`\rho_\bullet(\cdot)` the mean query/key/value over them:

    .. math::
        s(C,B) &= \tau\,\rho_q(C)^\top\rho_k(B) + \varepsilon(C)^\top\varepsilon(B)
                  + \log n(B) \\
        \mathrm{lse}(C) &= \log\textstyle\sum_{B} e^{s(C,B)}, \qquad
        \vartheta(C) = \textstyle\sum_B \mathrm{softmax}_B\,s(C,B)\;\rho_v(B) \\
        a(A) &= \textstyle\sum_{C \in \mathrm{chd}(A)} \frac{n(C)}{n(A)}
                \log\big(e^{a(C)} + e^{\mathrm{lse}(C)}\big),
                \qquad a(\text{leaf}) = -\infty \\
        \mu(C) &= \sigma\big(a(C) - \mathrm{lse}(C)\big)

    (:math:`a = -\varphi` is the negative energy of eq. 8) and the output of
    leaf :math:`i` on the path :math:`R = A_0 \supset A_1 \supset \dots \supset
    A_m = L_i` is

    .. math::
        \mathrm{out}_i = \sum_{t=0}^{m-1} \Big[\prod_{s=1}^{t}\mu(A_s)\Big]
                         \big(1-\mu(A_{t+1})\big)\,\vartheta(A_{t+1})
                         \;\big[+\ \textstyle\prod_{s=1}^{m}\mu(A_s)\,v_i
                         \text{ if include\_self}\big].

    This equals :math:`\hat\Theta V` with :math:`\hat\Theta` the KL-closest
    block-constrained row-stochastic matrix to flat softmax attention
    (Thm. 3.2); :func:`~hiergraph.ops.hierarchical_attention_matrix` builds
    :math:`\hat\Theta` densely for testing. The cost is :math:`O(\sum_f b_f^2)`
    over families :math:`f`, plus one scatter per depth level; all
    quantities are kept in log space and the backward pass is NaN-free.

    Args:
        q, k: ``[L, H, d]`` queries and keys in leaf order (``[L, d]`` is
            treated as one head).
        v: ``[L, H, d_v]`` values.
        hierarchy: a :class:`~hiergraph.data.SignalHierarchy`, a PyG batch of
            them, or a precomputed :class:`~hiergraph.ops.TreeIndex`.
        pos_emb: optional ``[N, c]`` or ``[N, H, c]`` position embedding
            :math:`\varepsilon` of every tree node (node order); siblings get
            the logit bias :math:`\varepsilon(C)^\top\varepsilon(B)`.
        include_self: give each leaf the self energy
            :math:`\tau q_i^\top k_i + \varepsilon_i^\top\varepsilon_i` (notes
            §2.8.9): a flat tree then gives standard softmax *with* the diagonal.
            Without it (the paper), the diagonal is excluded.
        causal: only siblings to the left (lower ``slot``) are attended.
            Requires ``include_self``. Ancestor statistics still include later
            leaves, so later tokens *do* influence earlier rows' weights
            through ancestors' means (notes §7.11b); future values get zero
            weight.
        leaf_mask: optional ``[L]`` bool, ``False`` for padding leaves: they
            are removed from all statistics and get a zero output.
        scale: logit scale :math:`\tau`, default :math:`1/\sqrt{d}`.
        kernel: ``'dense'`` runs each family size bucket as batched matrix
            products; ``'edge'`` scatters over sibling pairs. Same result.

    Returns:
        ``[L, H, d_v]`` (``[L, d_v]`` for 2-D inputs).
    """
    squeeze = q.dim() == 2
    if squeeze:
        q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
    index = hierarchy if isinstance(hierarchy, TreeIndex) else hierarchy.tree_index()
    _check_inputs(q, k, v, index, pos_emb, leaf_mask, causal, include_self, kernel)
    if index.device != q.device:
        raise ValueError(
            f"the hierarchy is on {index.device} but q is on {q.device}; move the hierarchy "
            "(hierarchy.to(device)) before calling"
        )
    num_leaves, heads, dim = q.shape
    tau = dim**-0.5 if scale is None else scale
    eps = None
    if pos_emb is not None:
        eps = pos_emb if pos_emb.dim() == 3 else pos_emb.unsqueeze(1)
        eps = eps.expand(-1, heads, -1)

    valid = torch.ones(num_leaves, dtype=torch.bool, device=q.device)
    if leaf_mask is not None:
        valid = leaf_mask.to(torch.bool)
    count = valid.to(q.dtype)

    # ---- bottom-up: leaf counts n and mean query/key/value rho of every node
    stacked = torch.cat([q, k, v], dim=-1)
    if leaf_mask is not None:
        stacked = stacked * count[:, None, None]
    sums, counts = _bottom_up_sums(index, stacked, count)
    n = counts  # [N] in BFS order
    rho = sums / n.clamp(min=1)[:, None, None]
    rho_q, rho_k, rho_v = rho.split([dim, dim, v.size(-1)], dim=-1)
    eps_bfs = None if eps is None else eps.index_select(0, index.order)

    # ---- family attention among siblings over pooled means
    family = _family_dense if kernel == "dense" else _family_edge
    lse, theta = family(index, rho_q, rho_k, rho_v, n, eps_bfs, tau, causal)

    # ---- bottom-up: a = -phi of every node, one step per depth level
    if include_self:
        self_energy = tau * (q * k).sum(-1)
        if eps is not None:
            self_energy = self_energy + (index.leaf_pos.take(eps_bfs) ** 2).sum(-1)
    else:
        self_energy = torch.full((num_leaves, heads), float("-inf"), dtype=q.dtype, device=q.device)
    a = _bottom_up_energy(index, self_energy, lse, n)

    # ---- top-down: gates along root paths and the output accumulator
    n0 = index.level_ptr[1]
    log_mu, log_one_minus_mu = log_gates(a[n0:], lse)
    u, out = _top_down(index, log_mu, log_one_minus_mu, theta)
    if include_self:
        out = out + torch.exp(u).unsqueeze(-1) * v
    if leaf_mask is not None:
        out = out * count[:, None, None]
    return out.squeeze(1) if squeeze else out


def _check_inputs(q, k, v, index, pos_emb, leaf_mask, causal, include_self, kernel) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name} must be [num_leaves, heads, dim], got shape {tuple(t.shape)}")
    if q.shape != k.shape:
        raise ValueError(
            f"q and k must have the same shape, got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    if v.shape[:2] != q.shape[:2]:
        raise ValueError(
            f"v must be [num_leaves, heads, d_v] = [{q.size(0)}, {q.size(1)}, *], "
            f"got {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype) or not q.is_floating_point():
        raise TypeError(
            f"q, k, v must share one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if q.size(0) != index.num_leaves:
        raise ValueError(
            f"q has {q.size(0)} rows but the hierarchy has {index.num_leaves} leaves; "
            "pass one row per leaf, in leaf order"
        )
    if pos_emb is not None:
        ok = pos_emb.dim() in (2, 3) and pos_emb.size(0) == index.num_nodes
        if pos_emb.dim() == 3:
            ok = ok and pos_emb.size(1) in (1, q.size(1))
        if not ok:
            raise ValueError(
                f"pos_emb must be [num_nodes={index.num_nodes}, c] or [num_nodes, heads, c], "
                f"got {tuple(pos_emb.shape)}"
            )
    if leaf_mask is not None and leaf_mask.shape != (index.num_leaves,):
        raise ValueError(
            f"leaf_mask must have shape [{index.num_leaves}], got {tuple(leaf_mask.shape)}"
        )
    if causal and not include_self:
        raise ValueError(
            "causal=True needs include_self=True: without leaf self-energies every node whose "
            "first child is a leaf has zero partition and rows collapse to 0 (notes/hsa.md §7.11a)"
        )
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def _bottom_up_sums(index: TreeIndex, leaf_values: Tensor, leaf_count: Tensor):
    """Sums of leaf values and leaf counts below every node, deepest level first (BFS order)."""
    sums, counts = [], []
    child_sum = child_count = None
    for d in range(index.num_levels - 1, -1, -1):
        size = index.level_ptr[d + 1] - index.level_ptr[d]
        if child_sum is None:
            s = leaf_values.new_zeros((size, *leaf_values.shape[1:]))
            c = leaf_count.new_zeros(size)
        else:
            pl = index.parent_local[d + 1]
            s = scatter(child_sum, pl, dim=0, dim_size=size, reduce="sum")
            c = scatter(child_count, pl, dim=0, dim_size=size, reduce="sum")
        local, ids = index.level_leaf_local[d], index.level_leaf_id[d]
        if local.numel() == size:  # a level of leaves only
            s, c = ids.take(leaf_values), ids.take(leaf_count)
        elif local.numel():
            s = s.index_add(0, local, ids.take(leaf_values))
            c = c.index_add(0, local, ids.take(leaf_count))
        sums.append(s)
        counts.append(c)
        child_sum, child_count = s, c
    return torch.cat(sums[::-1]), torch.cat(counts[::-1])


def _bottom_up_energy(index: TreeIndex, self_energy: Tensor, lse: Tensor, n: Tensor) -> Tensor:
    """``a = -phi`` of every node in BFS order (eq. 8), one scatter per depth level."""
    n0 = index.level_ptr[1]
    levels = []
    child_g = None
    for d in range(index.num_levels - 1, -1, -1):
        lo, hi = index.level_ptr[d], index.level_ptr[d + 1]
        heads = self_energy.size(1)
        if child_g is None:
            a = self_energy.new_zeros((hi - lo, heads))
        else:
            pl = index.parent_local[d + 1]
            a = scatter(child_g, pl, dim=0, dim_size=hi - lo, reduce="sum")
        local, ids = index.level_leaf_local[d], index.level_leaf_id[d]
        a = a.index_put((local,), ids.take(self_energy))
        levels.append(a)
        if d > 0:  # weighted log-partition each node hands to its parent
            n_child = n[lo:hi]
            n_parent = n[index.level_ptr[d - 1] : lo][index.parent_local[d]]
            weight = (n_child / n_parent.clamp(min=1)).unsqueeze(-1)
            g = logaddexp(a, lse[lo - n0 : hi - n0])
            keep = (n_child > 0).unsqueeze(-1)
            child_g = torch.where(keep, weight * torch.where(keep, g, torch.zeros_like(g)), 0.0)
    return torch.cat(levels[::-1])


def _top_down(index: TreeIndex, log_mu: Tensor, log_one_minus_mu: Tensor, theta: Tensor):
    """Path sums ``u`` (log of the mass passed down) and output accumulators ``acc``.

    Returns both at the leaves only, in leaf order: ``[L, H]`` and ``[L, H, d_v]``.
    """
    n0 = index.level_ptr[1]
    sizes = [index.level_ptr[d + 1] - index.level_ptr[d] for d in range(1, index.num_levels)]
    levels = zip(
        log_mu.split(sizes), log_one_minus_mu.split(sizes), theta.split(sizes), strict=True
    )
    u = log_mu.new_zeros((n0, log_mu.size(1)))
    acc = theta.new_zeros((n0, *theta.shape[1:]))
    us, accs = [u], [acc]
    for d, (lm, l1m, th) in enumerate(levels, start=1):
        pl = index.parent_local[d]
        u_parent = u.index_select(0, pl)
        acc = acc.index_select(0, pl) + torch.exp(u_parent + l1m).unsqueeze(-1) * th
        u = u_parent + lm
        us.append(u)
        accs.append(acc)
    return index.leaves_of_levels(us), index.leaves_of_levels(accs)


def _family_dense(index, rho_q, rho_k, rho_v, n, eps, tau, causal):
    """Sibling attention with every :class:`~hiergraph.ops.tree_index.FamilyBlock` as one
    batched matmul ``[F, H, W, d] @ [F, H, d, W]``.

    Returns ``lse [N - n0, H]`` and ``theta [N - n0, H, d_v]`` for the
    non-root nodes in BFS order.
    """

    members = index.family_members
    blocks = zip(
        index.blocks,
        members(rho_q),
        members(rho_k),
        members(rho_v),
        members(torch.log(n.clamp(min=1))),
        members(n > 0),
        members(eps) if eps is not None else [None] * len(index.blocks),
        strict=True,
    )
    lses = [rho_q.new_zeros((0, rho_q.size(1)))]
    thetas = [rho_v.new_zeros((0, *rho_v.shape[1:]))]
    for block, qb, kb, vb, log_n, key_ok, eb in blocks:
        f, w = block.count, block.width
        qb, kb, vb = qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2)  # [F, H, W, d]
        logits = tau * (qb @ kb.transpose(-1, -2)) + log_n[:, None, None, :]
        if eb is not None:
            eb = eb.transpose(1, 2)
            logits = logits + eb @ eb.transpose(-1, -2)
        ar = torch.arange(w, device=n.device)
        pair_ok = ar[None, :] < ar[:, None] if causal else ar[None, :] != ar[:, None]
        if block.valid is not None:
            key_ok = key_ok & block.valid
        lse, attn = masked_softmax(logits, key_ok[:, None, None, :] & pair_ok)
        theta = attn @ vb  # [F, H, W, d_v]
        lses.append(lse.transpose(1, 2).reshape(f * w, -1))
        thetas.append(theta.transpose(1, 2).reshape(f * w, *theta.shape[1:2], -1))
    lse, theta = torch.cat(lses), torch.cat(thetas)
    if index.block_back is not None:
        lse, theta = lse.index_select(0, index.block_back), theta.index_select(0, index.block_back)
    return lse, theta


def _family_edge(index, rho_q, rho_k, rho_v, n, eps, tau, causal):
    """Sibling attention as a scatter softmax over the list of sibling pairs."""
    n0, total = index.level_ptr[1], index.num_nodes
    query, key = index.sibling_pairs
    logits = tau * (rho_q[query] * rho_k[key]).sum(-1)
    if eps is not None:
        logits = logits + (eps[query] * eps[key]).sum(-1)
    logits = logits + torch.log(n[key].clamp(min=1)).unsqueeze(-1)
    ok = n[key] > 0
    if causal:
        ok = ok & (key < query)
    neg_inf = torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)
    logits = torch.where(ok.unsqueeze(-1), logits, neg_inf)
    m = scatter(logits.detach(), query, dim=0, dim_size=total, reduce="max")
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(logits - m[query])
    s = scatter(e, query, dim=0, dim_size=total, reduce="sum")
    has = s > 0
    s_safe = torch.where(has, s, torch.ones_like(s))
    lse = torch.where(has, m + torch.log(s_safe), neg_inf)
    attn = e / s_safe[query]
    theta = scatter(attn.unsqueeze(-1) * rho_v[key], query, dim=0, dim_size=total, reduce="sum")
    return lse[n0:], theta[n0:]
