r"""Exact Hierarchical Self-Attention (HSA) by the normalised two-pass dynamic program.

Amizadeh et al., *Hierarchical Self-Attention: Generalizing Neural Attention
Mechanics to Multi-Scale Problems* (Alg. 1–3, App. E), with the energies kept
normalised per leaf (no :math:`-1/(N\sqrt{d})` bookkeeping of eq. 15).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from hiergraph._checks import check_bool
from hiergraph._precision import accumulation_dtype, autocast_inputs, widened
from hiergraph.ops.hsa import native
from hiergraph.ops.hsa.causal import causal_hierarchical_attention
from hiergraph.ops.hsa.family_dense import family_attention_dense, wide_dominates
from hiergraph.ops.hsa.family_edge import family_attention_edge
from hiergraph.ops.hsa.heads_first import per_depth, per_level
from hiergraph.ops.hsa.inputs import check_inputs, check_kernel, logit_scale, no_leaves
from hiergraph.ops.hsa.padded import padded_hierarchical_attention
from hiergraph.ops.hsa.uniform import fits, kernel_gradients, uniform_hierarchical_attention
from hiergraph.ops.logspace import log_gates, logaddexp
from hiergraph.ops.rows import permute_rows
from hiergraph.ops.runs import broadcast_to_children, sum_children
from hiergraph.plan.costs import KERNEL_PADDING_COST, PADDING_COST
from hiergraph.plan.tree_index import TreeIndex


@autocast_inputs
def hierarchical_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    hierarchy,
    *,
    pos_emb: Tensor | None = None,
    include_self: bool = False,
    causal: bool = False,
    leaky_causal: bool = False,
    leaf_mask: Tensor | None = None,
    scale: float | None = None,
    kernel: str = "dense",
    size_bias: bool = True,
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

    bf16/fp16 inputs are computed in float32 and only the output and the gradients are
    rounded to their dtype (float32 and float64 inputs run in their own dtype throughout),
    except on equal-fanout forests too large for the op as one autograd node
    (:mod:`~hiergraph.ops.hsa.uniform_fused`) when a gradient is taken: there everything
    runs in the inputs' dtype except the leaf counts :math:`n(\cdot)`, their logs and
    ratios, the count-weighted sums and the child sums, which accumulate in float32
    before one rounding. Under autocast, ``q, k, v`` are
    first cast to the autocast dtype, as
    :func:`~torch.nn.functional.scaled_dot_product_attention` casts them.

    Args:
        q, k: ``[L, H, d]`` queries and keys in leaf order (``[L, d]`` is
            treated as one head).
        v: ``[L, H, d_v]`` values.
        hierarchy: a :class:`~hiergraph.data.SignalHierarchy`, a PyG batch of
            them, or a precomputed :class:`~hiergraph.plan.TreeIndex`.
        pos_emb: optional ``[N, c]`` or ``[N, H, c]`` position embedding
            :math:`\varepsilon` of every tree node (node order); siblings get
            the logit bias :math:`\varepsilon(C)^\top\varepsilon(B)`.
        include_self: give each leaf the self energy
            :math:`\tau q_i^\top k_i + \varepsilon_i^\top\varepsilon_i` (App. G.1): a flat
            tree then gives standard softmax *with* the diagonal. Without it (the
            paper's encoder), the diagonal is excluded.
        causal: strictly causal: row :math:`i` depends on the leaves :math:`j \le i`
            only (leaf order must be a depth-first order of every tree); computed by
            :func:`~hiergraph.ops.causal_hierarchical_attention` from prefix
            statistics, with ``kernel`` ``'dense'`` or ``'edge'`` (its paths). Requires
            ``include_self``; no ``leaf_mask``.
        leaky_causal: the paper's sibling masking (App. G.1): a node attends only to
            its left siblings (lower ``slot``). It is **not** causal: an ancestor's
            statistics include later leaves, so later tokens still change earlier
            rows' weights (future values get zero weight). Requires ``include_self``.
        leaf_mask: optional ``[L]`` bool, ``False`` for padding leaves: they
            are removed from all statistics and get a zero output. Their rows of ``q``,
            ``k``, ``v`` may hold any finite values; masking multiplies them by 0, so a
            NaN or inf there reaches the outputs (as in
            :func:`torch.nn.functional.scaled_dot_product_attention`).
        scale: logit scale :math:`\tau`, default :math:`1/\sqrt{d}`.
        kernel: ``'dense'`` runs families as batched matrix products: a forest
            with equal fanout on every level (``TreeIndex.uniform``, e.g. batches of
            :func:`~hiergraph.data.window_hierarchy` trees) as reshaped views of the
            whole level (:mod:`hiergraph.ops.hsa.uniform`); any other forest (ragged
            trees, window trees over sequences of different lengths) on the CPU in the
            compiled forest kernel (:func:`~hiergraph.ops.hsa.native.forest_attention`:
            float32/float64, without ``leaf_mask`` or ``leaky_causal``, unless its wide
            families dominate: :func:`~hiergraph.ops.hsa.family_dense.wide_dominates`), else as
            the same views of its padded embedding where that is expected to be cheaper
            (``TreeIndex.padded``, :mod:`hiergraph.ops.hsa.padded`), else as ``'blocks'``;
            ``'blocks'`` cuts each level into slices of equal-size families and padded
            gather blocks (:mod:`hiergraph.plan.costs`), on the CPU a block of 512 or more
            members in PyTorch's fused attention kernel; ``'edge'`` scatters over sibling
            pairs. Same result.
        size_bias: keep the :math:`\log n(B)` term (HSA proper). ``False``
            drops it, so every sibling sub-tree weighs as one token: an
            ablation, no longer KL-optimal (Thm. 3.2 needs the term).

    Returns:
        ``[L, H, d_v]`` (``[L, d_v]`` for 2-D inputs).
    """
    check_flags(causal, leaky_causal, include_self, kernel)
    check_bool(size_bias, "size_bias")
    if causal:
        if leaf_mask is not None or not size_bias:
            raise ValueError("causal=True runs without leaf_mask and with size_bias=True")
        return causal_hierarchical_attention(
            q, k, v, hierarchy, pos_emb=pos_emb, scale=scale, kernel=kernel
        )
    squeeze = q.dim() == 2
    if squeeze:
        q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
    index = TreeIndex.of(hierarchy)
    pos = check_inputs(q, k, v, index, pos_emb, leaf_mask)
    if not index.num_leaves:  # an empty forest: no plan to read (its levels are none)
        out = no_leaves(q, k, v, pos)
        return out.squeeze(1) if squeeze else out
    tau = logit_scale(scale, q)
    views = dict(
        include_self=include_self,
        left_only=leaky_causal,
        leaf_mask=leaf_mask,
        tau=tau,
        size_bias=size_bias,
    )
    path = attention_path(q, k, v, index, pos, kernel, leaf_mask, leaky_causal)
    if path == "uniform":
        eps = None if pos is None else per_depth(pos, index)
        out = uniform_hierarchical_attention(q, k, v, index.uniform, eps, **views)
    elif path == "forest":
        flags = dict(include_self=include_self, tau=tau, size_bias=size_bias)

        def recorded(q, k, v, eps):  # the same op on tensor operations (second derivatives)
            return general_attention(
                q, k, v, index, eps, left_only=False, leaf_mask=None, kernel="edge", **flags
            )

        out = native.forest_attention(q, k, v, pos, index, recorded=recorded, **flags)
    elif path == "padded":
        out = padded_hierarchical_attention(q, k, v, index, index.padded_on(q.device), pos, **views)
    else:  # bf16/fp16 in float32 throughout: half logits lose the softmax (NaN past 65504)
        out = general_attention(*widened(q, k, v), index, *widened(pos), kernel=kernel, **views)
        out = out.to(q.dtype)
    return out.squeeze(1) if squeeze else out


def attention_path(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    index: TreeIndex,
    pos: Tensor | None,
    kernel: str = "dense",
    leaf_mask: Tensor | None = None,
    leaky_causal: bool = False,
) -> str:
    """Where :func:`hierarchical_attention` runs (its arguments as it checked them,
    ``pos`` as :func:`~hiergraph.ops.hsa.inputs.head_pos_emb` views them): ``'uniform'``
    (reshaped views of an equal-fanout forest), ``'forest'`` (the compiled forest kernel),
    ``'padded'`` (reshaped views of the padded embedding), else ``'blocks'`` or ``'edge'``
    (the general path's family attention). The compiled forest kernel leaves a forest whose
    wide families dominate (:func:`~hiergraph.ops.hsa.family_dense.wide_dominates`) to the
    others: PyTorch's fused CPU attention kernel runs the block kernel's wide blocks."""
    if kernel == "dense" and fits(index.uniform, q):
        return "uniform"
    if (
        kernel == "dense"
        and leaf_mask is None
        and not leaky_causal
        and native.applies_to_forest(q, k, v, index, pos)
        and not wide_dominates(index)
    ):
        return "forest"
    padded = index.padded_on(q.device) if kernel == "dense" else None
    if (
        padded is not None
        and padded.pays_off(
            q.size(1),
            q.size(2) + v.size(2),
            padding_cost(q, k, v, padded, pos, leaky_causal),
            q.device,
        )
        and fits(padded.shape, q)
    ):
        return "padded"
    return "edge" if kernel == "edge" else "blocks"


def padding_cost(
    q: Tensor, k: Tensor, v: Tensor, padded, pos: Tensor | None, leaky_causal: bool
) -> float:
    """What a slot of the embedding ``padded`` costs (:mod:`hiergraph.plan.costs`): less
    where the compiled CPU kernel would run it (as
    :func:`~hiergraph.ops.hsa.uniform.uniform_hierarchical_attention` decides)."""
    trees, *fanout = padded.shape
    grad = kernel_gradients(q, k, v, None if pos is None else [pos], leaky_causal)
    kernel = grad is not None and native.applies(q, k, v, tuple(fanout), None, grad, trees)
    return KERNEL_PADDING_COST if kernel else PADDING_COST


def general_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    index: TreeIndex,
    pos: Tensor | None,
    *,
    include_self: bool,
    left_only: bool,
    leaf_mask: Tensor | None,
    tau: float,
    size_bias: bool,
    kernel: str = "dense",
    above: Callable[..., tuple[Tensor, Tensor]] | None = None,
) -> Tensor:
    r""":func:`hierarchical_attention` of ``q, k [L, H, d]``, ``v [L, H, d_v]`` (float32 or
    float64: callers widen half inputs, :func:`~hiergraph._precision.widened`) over any
    forest ``index``, level by level (the families of a level in dense blocks, or as sibling
    pairs with ``kernel="edge"``); ``pos``: the position embeddings ``[N, H | 1, c]``,
    ``left_only``: ``leaky_causal``, ``tau``: the logit scale.

    ``above``: a family that replaces the roots' families (:mod:`~hiergraph.ops.hsa.lifted`,
    with more members than the roots' children): called with the energies ``[n_1, H]``
    (``None``: :math:`-\infty`), mean ``[q, k, v]`` rows ``[n_1, H, ·]``, leaf counts
    ``[n_1]`` and position embeddings ``[n_1, H | 1, c]`` (or ``None``) of the roots'
    children (level 1, 0 rows without valid leaves), it returns the
    log mass ``[n_1, H]`` and the output ``[n_1, H, d_v]`` with which the top-down pass
    reaches them (without it: the roots' families, under mass 1).
    """
    levels = index.levels
    family = family_attention_edge if kernel == "edge" else family_attention_dense

    # leaf statistics: padding leaves count 0 and carry zeros; split by level once
    weight = None if leaf_mask is None else leaf_mask.to(q.dtype)
    stats = (q, k, v) if weight is None else tuple(t * weight[:, None, None] for t in (q, k, v))
    stats = [_split_leaves(index, t) for t in stats]
    counts = _leaf_counts(index, weight, q.dtype)
    self_energy = None
    if include_self:
        self_energy = tau * (q * k).sum(-1)
        if pos is not None:
            self_energy = self_energy + (pos.index_select(0, index.leaf_node) ** 2).sum(-1)
        self_energy = _split_leaves(index, self_energy)

    pos_levels = None if pos is None else per_level(pos, index)

    # ---- bottom-up: pooled means, family attention and a = -phi, deepest level first
    lses, thetas, energies = [None] * len(levels), [None] * len(levels), [None] * len(levels)
    sums = g = None
    for d in range(len(levels) - 1, 0, -1):
        level, n = levels[d], counts[d]
        if level.all_leaves:  # counts are 0/1 and padding leaves carry zeros: means = sums
            rho = [t[d] for t in stats]
        else:
            rho = [
                (_level_rows(index, d, t, s) / n.clamp(min=1)[:, None, None]).to(q.dtype)
                for t, s in zip(stats, sums, strict=True)
            ]
        child_energy = None if g is None else sum_children(g, levels[d + 1], level)
        a = _level_rows(index, d, self_energy, child_energy)
        pos_d = None if pos is None else pos_levels[d]
        if d == 1 and above is not None:  # the family above decides what reaches level 1
            top = above(a, rho, n, pos_d)
            break
        lse, theta, *sums = family(
            level, *rho, pos_d, n, tau, left_only=left_only, parent_level=levels[d - 1],
            size_bias=size_bias,
        )  # fmt: skip
        # weighted log-partition each node hands to its parent (eq. 8)
        share = n / counts[d - 1].index_select(0, level.parent_local).clamp(min=1)
        share = share.to(q.dtype).unsqueeze(-1)
        # with self energies every energy is finite (see uniform.finite_energies)
        total = lse if a is None else logaddexp(a, lse, finite_a=include_self)
        keep = (n > 0).unsqueeze(-1)
        g = torch.where(keep, share * torch.where(keep, total, 0.0), 0.0)
        lses[d], thetas[d], energies[d] = lse, theta, a

    # ---- top-down: log mass u passed down each root path and output accumulator acc
    n0 = index.level_ptr[1]
    u = q.new_zeros(n0, q.size(1))
    acc = v.new_zeros(n0, *v.shape[1:])
    us, accs = [u], [acc]
    for d in range(1, len(levels)):
        level, fanout = levels[d], levels[d - 1].fanout
        if d == 1 and above is not None:
            u, acc = top
        elif energies[d] is None and fanout:  # leaves below equal-size families: views only
            # mu = 0 at leaves without self energy (theta is 0 where a leaf has no siblings)
            shape = (-1, fanout, *thetas[d].shape[1:])
            weight_down = torch.exp(u).view(-1, 1, u.size(1), 1)
            acc = torch.addcmul(acc.unsqueeze(1), weight_down, thetas[d].view(shape))
            acc, u = acc.flatten(0, 1), None
        else:
            u_parent = broadcast_to_children(u, level, levels[d - 1])
            acc_parent = broadcast_to_children(acc, level, levels[d - 1])
            if energies[d] is None:
                log_mu, weight_down = None, torch.exp(u_parent)
            else:
                log_mu, log_one_minus_mu = log_gates(energies[d], lses[d], include_self)
                weight_down = torch.exp(u_parent + log_one_minus_mu)
            acc = torch.addcmul(acc_parent, weight_down.unsqueeze(-1), thetas[d])
            u = None if log_mu is None else u_parent + log_mu
        us.append(u)
        accs.append(acc)
    out = _gather_leaves(index, accs)
    if include_self:
        out = out + torch.exp(_gather_leaves(index, us)).unsqueeze(-1) * v
    elif len(levels) == 1:  # single leaves without self energy: no key, no mass; 0 * v, as
        out = out + 0.0 * v  # the attention matrix's product gives (a zero gradient, no error)
    if weight is not None:
        out = out * weight[:, None, None]
    return out


def check_flags(causal: bool, leaky_causal: bool, include_self: bool, kernel: str) -> None:
    """Checks the options of :func:`hierarchical_attention` (and of the layers over it)."""
    for name, flag in (("causal", causal), ("leaky_causal", leaky_causal),
                       ("include_self", include_self)):  # fmt: skip
        check_bool(flag, name)
    if causal and leaky_causal:
        raise ValueError("pass causal=True (strictly causal) or leaky_causal=True, not both")
    if (causal or leaky_causal) and not include_self:
        raise ValueError(
            f"{'causal' if causal else 'leaky_causal'}=True needs include_self=True: without "
            "leaf self-energies every node whose first child is a leaf has no key and its rows "
            "collapse to 0 (Amizadeh et al., App. G.1)"
        )
    check_kernel(kernel, causal)


def _leaf_counts(index: TreeIndex, weight: Tensor | None, dtype) -> list[Tensor]:
    """Per level, ``[n_d]`` number of (valid) leaves below every node, in float32 for
    bf16/fp16 inputs ``dtype`` (in ``dtype`` otherwise): a bf16 count rounds 257 to 256
    and an fp16 one overflows past 65504, so counts, ``log n`` and the count ratios are
    computed in this dtype and only their results are cast to ``dtype``."""
    dtype = accumulation_dtype(dtype)
    if weight is None:
        return [level.count.to(dtype) for level in index.levels]
    weight = _split_leaves(index, weight.to(dtype))
    counts = [None] * index.num_levels
    for d in range(index.num_levels - 1, -1, -1):
        child = None
        if d + 1 < index.num_levels:
            child = sum_children(counts[d + 1], index.levels[d + 1], index.levels[d])
        counts[d] = _level_rows(index, d, weight, child)
    return counts


def _split_leaves(index: TreeIndex, x: Tensor) -> list[Tensor]:
    """Per level, the rows of ``x`` (``[L, ...]``, leaf order) of the level's leaves in
    their order on the level (``[0, ...]`` where a level has none): one permutation and a
    split, whose backward is a concatenation and the inverse permutation (a gather per
    level would zero a gradient the size of ``x`` for each)."""
    if index.leaf_perm is not None:
        x = permute_rows(x, index.leaves_by_level, index.leaf_perm)
    return list(x.split([level.leaf_local.numel() for level in index.levels]))


def _gather_leaves(index: TreeIndex, per_level: list[Tensor]) -> Tensor:
    """Leaf rows, in leaf order, of per-level tensors ``per_level[d]: [n_d, ...]``."""
    parts = []
    for level, x in zip(index.levels, per_level, strict=True):
        if level.all_leaves:
            parts.append(x)
        elif level.leaf_local.numel():
            parts.append(x.index_select(0, level.leaf_local))
    out = torch.cat(parts) if len(parts) > 1 else parts[0]
    if index.leaf_perm is None:
        return out
    return permute_rows(out, index.leaf_perm, index.leaves_by_level)


def _level_rows(index: TreeIndex, d: int, leaf_values: list | None, inner: Tensor | None):
    """Rows ``[n_d, ...]`` of level ``d``: ``inner`` (rows of the level, ignored at leaves)
    at internal nodes and ``leaf_values[d]`` (:func:`_split_leaves`)
    at the leaves.

    Leaves without values get ``-inf`` (no self energy); ``None`` when an
    all-leaf level has no values.
    """
    level = index.levels[d]
    if level.all_leaves:
        return None if leaf_values is None else leaf_values[d]
    if not level.leaf_local.numel():
        return inner
    if leaf_values is None:
        return inner.index_fill(0, level.leaf_local, float("-inf"))
    return inner.index_put((level.leaf_local,), leaf_values[d])
