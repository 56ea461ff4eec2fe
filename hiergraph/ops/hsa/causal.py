r"""Strictly causal Hierarchical Self-Attention with prefix statistics.

The paper's hierarchical causal masking (App. G.1: each family attends only to
its *left* siblings, :math:`\mathrm{sib}_L`) is not causal as an operator on
sequences: the statistics of an ancestor (its mean query and its energy
:math:`\varphi`) include the leaves to the right of a token, so future tokens
change earlier rows. Here every row is computed from
the statistics of the *prefix* it may see, exactly what an incremental decoder
with a hierarchical cache computes (App. G.2, :mod:`hiergraph.nn.hierarchical_kv_cache`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hiergraph._autograd import records_grad
from hiergraph._precision import accumulation_dtype, autocast_inputs
from hiergraph.ops.hsa import native
from hiergraph.ops.hsa.causal_uniform import uniform_causal_attention
from hiergraph.ops.hsa.heads_first import per_depth
from hiergraph.ops.hsa.inputs import (
    check_kernel,
    check_qkv,
    check_structure_device,
    head_pos_emb,
    logit_scale,
    no_leaves,
)
from hiergraph.ops.hsa.padded import on_slots
from hiergraph.ops.hsa.uniform import fits
from hiergraph.ops.logspace import log_gates, logaddexp, scatter_softmax
from hiergraph.plan.causal_plan import CausalPlan
from hiergraph.plan.tree_index import TreeIndex


@autocast_inputs
def causal_hierarchical_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    hierarchy,
    *,
    pos_emb: Tensor | None = None,
    scale: float | None = None,
    kernel: str = "dense",
) -> Tensor:
    r"""Strictly causal HSA: the output of leaf :math:`i` depends on leaves :math:`j \le i` only.

    **Semantics.** Let :math:`T_{\le i}` be the hierarchy restricted to the
    leaves :math:`j \le i` (leaf order, a depth-first order of the tree), and
    :math:`\hat\Theta^{L}(T)` the HSA matrix with leaf self-energies and
    left-sibling masking (App. G.1; ``hierarchical_attention(...,
    include_self=True, leaky_causal=True)``). Then

    .. math::
        \mathrm{out}_i = \big(\hat\Theta^{L}(T_{\le i})\, V\big)_i ,

    i.e. row :math:`i` of the KL-closest block-constrained row-stochastic
    matrix on the prefix tree :math:`T_{\le i}` to the causal
    (diagonal-including) flat softmax on :math:`j \le i`. The stacked rows
    :math:`\hat\Theta^{c}` are lower-triangular and row-stochastic; within a row, all
    leaves of a left sibling sub-tree get equal weight. It is what
    incremental decoding computes (:class:`~hiergraph.nn.HierarchicalKVCache`).
    For the last leaf of a tree it equals the paper's causal HSA row.

    **Recurrence.** For leaf :math:`i` on the path :math:`R = A_0 \supset A_1
    \supset\dots\supset A_m = L_i`, with :math:`\mathrm{sib}_L(A)` the left
    siblings of :math:`A` (complete, since the order is depth-first),
    :math:`n,\ \Sigma_\bullet` complete leaf counts and sums, the prefix
    statistics are (:math:`s = m, \dots, 1`)

    .. math::
        n_i(A_s) &= n_i(A_{s+1}) + \textstyle\sum_{B\in\mathrm{sib}_L(A_{s+1})} n(B),
        \qquad n_i(A_m) = 1 \\
        \rho^{(i)}_q(A_s) &= \big(q_i + \textstyle\sum_{r>s}\sum_{B\in\mathrm{sib}_L(A_r)}
                             \Sigma_q(B)\big) / n_i(A_s) \\
        s_i(A_s, B) &= \tau\,\rho^{(i)}_q(A_s)^\top\rho_k(B)
                       + \varepsilon(A_s)^\top\varepsilon(B) + \log n(B),
                       \quad B\in\mathrm{sib}_L(A_s) \\
        \mathrm{lse}_i(A_s) &= \log\textstyle\sum_B e^{s_i(A_s,B)}, \qquad
        \vartheta_i(A_s) = \textstyle\sum_B \mathrm{softmax}_B\, s_i(A_s,\cdot)\,\rho_v(B) \\
        a_i(A_s) &= \Big(\textstyle\sum_{B\in\mathrm{sib}_L(A_{s+1})} n(B)\,g(B)
                    + n_i(A_{s+1})\,g_i(A_{s+1})\Big) / n_i(A_s),
        \quad a_i(L_i) = \tau q_i^\top k_i + \varepsilon_i^\top\varepsilon_i \\
        g_i(A) &= \log\big(e^{a_i(A)} + e^{\mathrm{lse}_i(A)}\big), \qquad
        \mu_i(A) = \sigma\big(a_i(A) - \mathrm{lse}_i(A)\big)

    where :math:`g(B)` is :math:`g_j(B)` at the last leaf :math:`j` of
    :math:`B` (its complete value), and the output is

    .. math::
        \mathrm{out}_i = \sum_{s=1}^{m}\Big[\prod_{r<s}\mu_i(A_r)\Big]
            \big(1-\mu_i(A_s)\big)\,\vartheta_i(A_s)
            + \prod_{r=1}^{m}\mu_i(A_r)\, v_i .

    There are :math:`L \cdot \mathrm{depth}` prefix statistics, each an attention
    over at most :math:`b` left siblings: :math:`O(L\, b\, \mathrm{depth}\, d)`
    time (one edge list per depth level; the non-causal HSA is
    :math:`O(L\, b\, d)`). Only the leaf self-energy variant is defined
    (without it, a node whose first child is a leaf has no key and rows collapse).

    Args:
        q, k: ``[L, H, d]`` queries and keys in leaf order (``[L, d]``: one head).
        v: ``[L, H, d_v]`` values.
        hierarchy: a :class:`~hiergraph.data.SignalHierarchy`, a PyG batch of
            them (trees are independent), a :class:`~hiergraph.plan.TreeIndex` or a
            :class:`~hiergraph.plan.CausalPlan`.
        pos_emb: optional ``[N, c]`` or ``[N, H, c]`` position embedding of
            every node (node order); siblings get the bias
            :math:`\varepsilon(A)^\top\varepsilon(B)`, leaves the self term
            :math:`\varepsilon_i^\top\varepsilon_i`.
        scale: logit scale :math:`\tau`, default :math:`1/\sqrt{d}`.
        kernel: ``'dense'`` runs a forest with equal fanout on every level
            (``TreeIndex.uniform``) as reshaped views of whole levels
            (:mod:`hiergraph.ops.hsa.causal_uniform`), and so a forest padded to one
            whose padding follows every tree's leaves (``TreeIndex.padded`` with
            ``leaves_lead``: window trees over sequences of different
            lengths; a causal row never reads the padding, so no mask is needed), any
            other forest on the CPU (float32/float64 after the cast below, eager) in the
            compiled causal kernel (:func:`~hiergraph.ops.hsa.native.causal_forest_attention`,
            one task per tree and head walking its leaves as a decoder would), and
            elsewhere as ``'edge'``, which gathers and scatters over (leaf, ancestor) pairs
            and left-sibling edges. Same result.

    Returns:
        ``[L, H, d_v]`` (``[L, d_v]`` for 2-D inputs), in the inputs' dtype. bf16/fp16
        inputs are computed in float32 and the output rounded once (a bf16 leaf
        count stops at 256); float32/float64 inputs run in their own dtype. Under
        autocast, ``q, k, v`` are first cast to the autocast dtype.
    """
    squeeze = q.dim() == 2
    if squeeze:
        q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
    check_kernel(kernel, causal=True)
    # an equal-fanout forest runs as reshaped views of the tree index alone, its leaf order
    # depth-first by construction; every other forest builds (and caches) the causal plan
    # first, which checks that order (a flat family of 8,192 leaves took 1.6 s to plan)
    plan = hierarchy if isinstance(hierarchy, CausalPlan) else None
    index = TreeIndex.of(hierarchy)
    eps = _check_inputs(q, k, v, index, pos_emb)
    if not index.num_leaves:  # an empty forest: no plan to read (its levels are none)
        return _out(no_leaves(q, k, v, eps), q.dtype, squeeze)
    tau = logit_scale(scale, q)
    # bf16/fp16: counts, prefix sums and softmax sums in float32, the output rounded once
    dtype, work = q.dtype, accumulation_dtype(q.dtype)
    q, k, v = q.to(work), k.to(work), v.to(work)
    eps = None if eps is None else eps.to(work)
    if kernel == "dense" and runs_as_views(index.uniform, q, k, v, eps):
        levels = None if eps is None else per_depth(eps, index)
        return _out(uniform_causal_attention(q, k, v, index.uniform, levels, tau), dtype, squeeze)
    if plan is None:
        plan = index.causal_plan
    # as much padding as on the CPU: the alternative is the edge lists, whose operations
    # do not grow with the family blocks
    forest = index.padded_on(q.device, extended=False) if kernel == "dense" else None
    # padding after every tree's leaves: no causal row reads it
    if forest is not None and forest.leaves_lead and runs_as_views(forest.shape, q, k, v, eps):
        out = on_slots(uniform_causal_attention, q, k, v, index, forest, eps, tau=tau)
        return _out(out, dtype, squeeze)
    if kernel == "dense" and native.applies_to_causal(q, k, v, eps):

        def recorded(q, k, v, e):  # the same op on tensor operations (second derivatives)
            return _edge_attention(q, k, v, plan, e, tau)[0]

        out = native.causal_forest_attention(q, k, v, eps, plan, tau=tau, recorded=recorded)
        return _out(out, dtype, squeeze)
    return _out(_edge_attention(q, k, v, plan, eps, tau)[0], dtype, squeeze)


#: Most elements of the largest per-depth logits ``[L, H, b]`` that the reshaped views take
#: past :func:`~hiergraph.ops.hsa.uniform.fits` (1 GiB in float32): see
#: :func:`runs_as_views`.
MAX_VIEW_ELEMENTS = 1 << 28


def runs_as_views(
    shape: tuple[int, ...] | None, q: Tensor, k: Tensor, v: Tensor, eps: Tensor | None
) -> bool:
    """Whether the strictly causal op runs the equal-fanout forest ``shape`` (or ``None``)
    as reshaped views (:mod:`~hiergraph.ops.hsa.causal_uniform`): where its logits fit
    (:func:`~hiergraph.ops.hsa.uniform.fits`), and past that, up to
    :data:`MAX_VIEW_ELEMENTS`, where the alternative is worse: the edge lists, whose
    gathered rows (about ``L b / 2`` per depth, of ``d + d_v`` channels each) outgrow the
    views' logits (``L b`` per depth) many times over, or the compiled kernel over a
    family of :data:`~hiergraph.ops.hsa.native.WIDE_FANOUT` or more members (a star of
    4,096 leaves, forward+backward, 4 heads x 64, 2 threads: the kernel 0.85 s (1.5 s in
    other runs), the views 0.21 s with their wide leaf families in the fused kernel; SDPA
    with a causal mask 0.18 s; ``benchmarks/hsa_wide.py``)."""
    if shape is None:
        return False
    if fits(shape, q, causal=True):
        return True
    widest = max(shape[1:])
    kernel = native.applies_to_causal(q, k, v, eps) and widest < native.WIDE_FANOUT
    return not kernel and math.prod(shape) * q.size(1) * widest <= MAX_VIEW_ELEMENTS


def causal_statistics(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    hierarchy,
    *,
    pos_emb: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""Strictly causal HSA, and the node statistics a cache holds.

    The same formulas as :func:`causal_hierarchical_attention` (``q, k [L, H, d]``,
    ``v [L, H, d_v]`` in the inputs' dtype, which must be float32 or float64), computed in
    the compiled causal kernel (:func:`~hiergraph.ops.hsa.native.causal_forest_statistics`:
    CPU, eager, nothing recording gradients), else on the edge lists (differentiable).

    Returns:
        ``out [L, H, d_v]``, the sums :math:`\Sigma_q, \Sigma_k, \Sigma_v` of every node
        over its leaves ``[N, H, d + d + d_v]``, and :math:`g` of every node at its last leaf
        ``[N, H]`` (the complete :math:`g(B)` of a node; a root's is 0), from which
        :meth:`~hiergraph.nn.HierarchicalKVCache.prefill` builds its store.
    """
    plan = CausalPlan.of(hierarchy)
    eps = _check_inputs(q, k, v, plan.tree_index, pos_emb)
    tau = logit_scale(scale, q)
    if not records_grad(q, k, v, eps) and native.applies_to_causal(q, k, v, eps):
        return native.causal_forest_statistics(q, k, v, eps, plan, tau=tau)
    out, sums, per_depth = _edge_attention(q, k, v, plan, eps, tau)
    return out, sums, sum(per_depth, q.new_zeros((plan.num_nodes, q.size(1))))


@torch.compiler.disable
def _edge_attention(q, k, v, plan: CausalPlan, eps, tau: float):
    """The edge-list kernel: ``out``, the node sums as :func:`causal_statistics` returns
    them, and per depth ``[N, H]`` the complete energies :math:`g` of that depth's nodes (0
    elsewhere).

    It runs eagerly inside ``torch.compile`` (a graph break; ``fullgraph=True`` refuses
    it): inductor (PyTorch 2.13) fuses reads of its scatters' sums ahead of their writes,
    which gave wrong outputs on ragged forests, or generated code that failed.
    """
    num_nodes = plan.num_nodes

    # complete sums and counts of every node (one scatter over (leaf, ancestor) pairs)
    dq, dk = q.size(-1), k.size(-1)
    sums = _sum_rows(_rows(torch.cat([q, k, v], -1), plan.anc_leaf), plan.anc_node, num_nodes)
    n = plan.count.to(q.dtype)
    rho_k = sums[..., dq : dq + dk] / n[:, None, None]
    rho_v = sums[..., dq + dk :] / n[:, None, None]
    log_n = torch.log(n)[:, None]
    # sum of the queries of each node's left siblings
    left_q = _sum_rows(_rows(sums[..., :dq].contiguous(), plan.sib_key), plan.sib_query, num_nodes)
    self_energy = tau * (q * k).sum(-1)
    if eps is not None:
        self_energy = self_energy + (_rows(eps, plan.leaf_node) ** 2).sum(-1)

    # ---- bottom-up over depth: prefix statistics of every (leaf, ancestor) pair
    lses, thetas, energies = {}, {}, {}
    sq_child = g_child = left_g = None
    complete = []
    for s in range(plan.max_depth, 0, -1):
        pl, pn = plan.pair_leaf[s], plan.pair_node[s]
        is_leaf = plan.pair_is_leaf[s][:, None]
        count = plan.pair_count[s].to(q.dtype)[:, None]
        if sq_child is None:  # deepest level: leaves only
            sq, a = _rows(q, pl), _rows(self_energy, pl)
        else:
            # a leaf's pair has no child (ancestor -1): its row is read, then discarded
            ch, child_node = plan.pair_child[s], plan.ancestors[pl, s + 1].clamp(min=0)
            child_count = plan.pair_count[s + 1].to(q.dtype)[ch][:, None]
            inner = _rows(sq_child, ch) + _rows(left_q, child_node)
            sq = torch.where(is_leaf[..., None], _rows(q, pl), inner)
            inner_a = (_rows(left_g, child_node) + child_count * _rows(g_child, ch)) / count
            a = torch.where(is_leaf, _rows(self_energy, pl), inner_a)
        lse, theta = _left_attention(
            sq / count[..., None], plan.key_pair[s], plan.key_node[s], pn,
            rho_k, rho_v, log_n, eps, tau,
        )  # fmt: skip
        g = logaddexp(a, lse, finite_a=True)  # energies are finite: only lse can be -inf
        lses[s], thetas[s], energies[s] = lse, theta, a
        # complete g of the depth-s nodes, and its n-weighted sums over left siblings
        g_node = g.new_zeros((num_nodes, g.size(1)))
        g_node = g_node.index_copy(0, plan.depth_nodes[s], _rows(g, plan.last_pair[s]))
        complete.append(g_node)
        left_g = _rows(n, plan.sib_key)[:, None] * _rows(g_node, plan.sib_key)
        left_g = _sum_rows(left_g, plan.sib_query, num_nodes)
        sq_child, g_child = sq, g

    # ---- top-down: gates along each root path, output accumulation
    u = q.new_zeros(q.shape[:2])
    out = v.new_zeros(v.shape)
    for s in range(1, plan.max_depth + 1):
        pl = plan.pair_leaf[s]
        log_mu, log_one_minus_mu = log_gates(energies[s], lses[s], finite=True)
        weight = torch.exp(_rows(u, pl) + log_one_minus_mu)
        out = out.index_add(0, pl, weight[..., None] * thetas[s])
        u = u.index_add(0, pl, log_mu)
    return out + torch.exp(u)[..., None] * v, sums, complete


def _out(out: Tensor, dtype: torch.dtype, squeeze: bool) -> Tensor:
    """The output rounded once to the inputs' dtype, ``[L, d_v]`` for 2-D inputs."""
    out = out.to(dtype)
    return out.squeeze(1) if squeeze else out


def _left_attention(rho_q, key_pair, key_node, pair_node, rho_k, rho_v, log_n, eps, tau):
    """Softmax of every pair's prefix query over the left siblings of its node: on the CPU
    one call of the compiled kernel (:func:`~hiergraph.ops.hsa.native.edge_softmax`, which
    forms no per-edge rows), elsewhere :func:`_gathered_attention`.

    Returns ``lse [P, H]`` (``-inf`` without left siblings) and ``theta [P, H, d_v]``.
    """
    if not native.applies_to_edges(rho_q):
        return _gathered_attention(
            rho_q, key_pair, key_node, pair_node, rho_k, rho_v, log_n, eps, tau
        )

    def recorded(q, k, v, e):  # the same op, recorded by autograd (second derivatives)
        return _gathered_attention(q, key_pair, key_node, pair_node, k, v, log_n, e, tau)

    return native.edge_softmax(
        rho_q, rho_k, rho_v, log_n.view(-1), eps, pair_node, key_pair, key_node, tau, recorded
    )


def _gathered_attention(rho_q, key_pair, key_node, pair_node, rho_k, rho_v, log_n, eps, tau):
    """:func:`_left_attention` as gathers of every edge's rows, a scatter softmax and a
    scatter of the weighted values."""
    num_pairs = rho_q.size(0)
    rho_k, log_n = _rows(rho_k, key_node), _rows(log_n, key_node)
    logits = tau * (_rows(rho_q, key_pair) * rho_k).sum(-1) + log_n
    if eps is not None:
        logits = logits + (_rows(eps, pair_node[key_pair]) * _rows(eps, key_node)).sum(-1)
    lse, weights = scatter_softmax(logits, key_pair, num_pairs)
    theta = _sum_rows(weights[..., None] * _rows(rho_v, key_node), key_pair, num_pairs)
    return lse, theta


def _rows(x: Tensor, index: Tensor) -> Tensor:
    """``x[index]`` for a 1-D ``index`` of rows, as ``index_select``: its backward adds the
    rows in index order with ``index_add`` (``x[index]``'s accumulating ``index_put`` is
    several times slower on the CPU and, on accelerators, ordered by atomics)."""
    return x.index_select(0, index)


def _sum_rows(src: Tensor, index: Tensor, size: int) -> Tensor:
    """``out[index[e]] += src[e]`` in edge order (so a row's sum never depends on other rows)."""
    return src.new_zeros((size, *src.shape[1:])).index_add(0, index, src)


def _check_inputs(q, k, v, index: TreeIndex, pos_emb) -> Tensor | None:
    check_qkv(q, k, v, index.num_leaves, index.num_nodes)
    check_structure_device(index.device, q)
    if pos_emb is None:
        return None
    return head_pos_emb(pos_emb, q, index.num_nodes).expand(-1, q.size(1), -1)
