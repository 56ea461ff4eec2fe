r"""Equal-fanout HSA as one autograd node, with its backward written out.

:func:`~hiergraph.ops.hsa.uniform.uniform_hierarchical_attention` records every level's
operations for autograd, whose backward then runs node by node: at a few thousand leaves
the bookkeeping of those nodes and their saved tensors costs as much as the products. When
every node has its siblings as keys (no ``leaky_causal``), the whole op is one node here:
the forward runs the two passes without recording and keeps what the backward reads, and
the backward is two sweeps over the levels, each a fixed handful of batched operations.

Notation (:func:`~hiergraph.ops.hierarchical_attention`): a level's families are
``[H F, b, ·]`` batches, views of its node rows ``[H, n, ·]``. A node's rows are kept as
the *sums* :math:`\bar q, \bar k, \bar v` over its :math:`n` leaves (pooling is one sum
per level; the means' :math:`1 / n` goes into the products' scale). Logits
:math:`S = \tau n^{-2} \bar q \bar k^\top + \varepsilon\varepsilon^\top` (the diagonal
left out), weights :math:`P = \mathrm{softmax}(S)`, log-partition :math:`\ell` (plus
:math:`\log n` with the size bias: every key of a level has :math:`n` leaves), energy
:math:`a` (the leaves' self energies :math:`S_{ii}`, else the mean of the children's
:math:`\log(e^{a} + e^{\ell})`), gate :math:`\mu = \sigma(a - \ell)`. The top-down
pass carries the log mass :math:`u` that reaches a node; its family's weights are
:math:`W = e^{\delta} P` with :math:`\delta = u_{\uparrow} + \log(1 - \mu)`, then
:math:`u = u_{\uparrow} + \log\mu`, a leaf keeps :math:`W_{ii} = e^{u_i}`, and the
output accumulates :math:`n^{-1} W \bar v` onto the parent's rows.

Backward, from the output gradient :math:`G`:

1. leaves to roots: :math:`G` of a level is the sum of its children's (the accumulator is
   broadcast down), :math:`dW = n^{-1} G \bar v^\top`, :math:`d\delta = \mathrm{rowsum}(dW \odot W)`
   (off the diagonal), :math:`du = dW_{ii} e^{u_i}` at the leaves and the sum over the
   children of :math:`du + d\delta` above them;
2. roots to leaves: with :math:`x = a - \ell` and :math:`g` the parent's energy gradient
   over :math:`b`, :math:`dx = du\,(1 - \mu) - d\delta\,\mu`, :math:`da = dx + g\mu`,
   :math:`d\ell = g(1 - \mu) - dx`; the softmax gives
   :math:`dS = W \odot dW - P \odot (d\delta - d\ell)` (:math:`dS_{ii} = da_i` at the
   leaves), then :math:`d\bar q = \tau n^{-2} dS\, \bar k`,
   :math:`d\bar k = \tau n^{-2} dS^\top \bar q`, :math:`d\bar v = n^{-1} W^\top G`,
   :math:`d\varepsilon = (dS + dS^\top)\,\varepsilon`, each plus
   the parent's gradient (the rows are sums).

With masked leaves (zero rows), :math:`n` is each node's own count of valid leaves: the
logits are :math:`\tau\, \bar q_i \bar k_j^\top / (n_i n_j)`, a key without leaves is
left out, its weight :math:`n_j^{-1}` goes with its column of :math:`W`, a parent's energy
is the count-weighted mean :math:`\sum_C n(C) / n(A) \log(e^{a} + e^{\ell})`, and so
:math:`g` is :math:`n(C) / n(A)` of the parent's energy gradient.

Second derivatives (``create_graph=True``) recompute the op with autograd recording and
differentiate that. Under ``torch.compile`` the recorded path is traced instead (inductor
fuses it itself).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from hiergraph._autograd import AutogradFunction, recorded_gradients
from hiergraph.ops.hsa import family, token_layout
from hiergraph.ops.hsa.family_products import family_gram, family_product, family_sum
from hiergraph.ops.logspace import log_gates, logaddexp, softmax_

#: Largest ``q`` (elements) that runs fused. Above it the memory of the passes dominates,
#: where the fused op keeps more at once (a level's weights before and after the gates, and
#: every level's first-sweep gradients): the peak of a forward+backward over contiguous
#: ``[L, 4, 64]`` inputs grew from 488 to 589 MB at 64K leaves and from 1.76 to 2.37 GB at
#: 256K, while the recorded op runs there at 0.9–1.05× the per-level bound on heads-first
#: inputs (1.1–1.35× on contiguous ones, which it copies).
MAX_ELEMENTS = 1 << 22

#: :data:`MAX_ELEMENTS` off the CPU. On an accelerator the op is launch-bound well past it:
#: its eager time is about a fixed cost per dispatched operation until a few tens of
#: thousands of leaves (one H200, forward+backward of 64 x 128 to 16K leaves, 8 heads x 64:
#: 3.4–11 ms eager, 0.5–1.4 ms replayed as a CUDA graph), and the fused op dispatches about
#: half as many operations as the recorded one (``benchmarks/dispatch_count.py``).
MAX_ELEMENTS_ACCELERATOR = 1 << 25


@dataclass
class _Level:
    """What the bottom-up pass keeps of a level, for the top-down pass and the backward:
    the families' rows ``q, k, v`` (``[H F, b, ·]``; node-major leaves ``[F, b, H, ·]``)
    and position embeddings ``eps``, the sibling softmax ``p`` and its log-normaliser
    ``lse``, the nodes' energies ``energy`` (``None`` without one), what the products divide
    by (``divisor``: an int ``n``, or per key :math:`1/n` on a masked level) and its
    per-logit ``outer`` product (masked levels); the top-down pass adds the gates ``mu``,
    the weights ``w`` and the leaves' own weights ``own``."""

    q: Tensor
    k: Tensor
    v: Tensor
    eps: Tensor | None
    p: Tensor
    lse: Tensor
    energy: Tensor | None
    divisor: Tensor | int
    outer: Tensor | None
    mu: Tensor | None = None
    w: Tensor | None = None
    own: Tensor | None = None


def max_elements(device: torch.device) -> int:
    """Largest ``q`` (elements) that runs fused with gradients on ``device``."""
    return MAX_ELEMENTS if device.type == "cpu" else MAX_ELEMENTS_ACCELERATOR


def fused_uniform_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    fanout: tuple[int, ...],
    eps: list[Tensor] | None,
    *,
    include_self: bool,
    tau: float,
    size_bias: bool,
    recorded=None,
    node_major: bool = False,
    counts: list[Tensor] | None = None,
    above=None,
) -> Tensor:
    r"""HSA of heads-first ``q, k [H, L, d]``, ``v [H, L, d_v]`` over a forest with
    ``fanout`` ``(b_1, …, b_D)`` (``L`` a multiple of :math:`b_1 \cdots b_D`); ``eps`` per
    depth ``[H | 1, n_d, c]``. Returns ``[H, L, d_v]``. ``node_major``: ``q, k, v`` are
    contiguous ``[L, H, ·]`` instead, read where they lie by the leaf level (one product per
    head on strided views, :mod:`~hiergraph.ops.hsa.token_layout`), and the output and the
    gradients of ``q, k, v`` come in that layout, ``[L, H, ·]``.

    ``counts``: the leaf counts of every level of a forest with masked leaves, whose rows
    of ``q, k, v`` are zero there (heads first; as in
    :func:`~hiergraph.ops.hsa.uniform.uniform_hierarchical_attention`, :func:`_forward`).
    ``recorded`` is the same op with autograd recording, ``recorded(q, k, v, eps)`` (second
    derivatives), and the op one autograd node. Without it no gradient is taken
    (inference): the two passes run alone, keeping no level once it is used, node-major
    leaves with counts and ``above``, a family above the roots, included. They take fewer
    operations than the recorded op (sums instead of means, the gates in log space, families
    of two added): 1.05–1.15× faster in the inference benchmark (caches evicted between
    calls), more on warm caches."""
    shares = None if counts is None else [family.child_shares(n) for n in counts]
    if recorded is None:
        options = (include_self, tau, size_bias, node_major)
        return _forward(
            q, k, v, eps, tuple(fanout), *options, keep=False, counts=counts, shares=shares,
            above=above,
        )[0]  # fmt: skip
    eps = [] if eps is None else list(eps)
    options = (tuple(fanout), include_self, tau, size_bias, recorded, node_major, counts, shares)
    return _FusedUniform.apply(options, q, k, v, *eps)


class _FusedUniform(AutogradFunction):
    @staticmethod
    def forward(ctx, options, q, k, v, *eps):
        fanout, include_self, tau, size_bias, _, node_major, counts, shares = options
        out, levels = _forward(
            q, k, v, eps or None, fanout, include_self, tau, size_bias, node_major,
            counts=counts, shares=shares,
        )  # fmt: skip
        ctx.options, ctx.levels = options, levels
        ctx.save_for_backward(q, k, v, *eps)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        fanout, _, tau, _, recorded, node_major, _, shares = ctx.options
        q, k, v, *eps = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the recorded op
            return None, *recorded_gradients(recorded, (q, k, v, eps or None), grad)
        grads = _backward(grad.contiguous(), ctx.levels, fanout, tau, len(eps), node_major, shares)
        return None, *grads


def _forward(
    q, k, v, eps, fanout, include_self, tau, size_bias, node_major, keep=True, counts=None,
    shares=None,
    above=None,
):  # fmt: skip
    """The two passes without recording; returns the output and, per level, what the
    backward reads. A level's families are ``[H F, b, ·]`` batches (views of its node rows
    ``[H, n, ·]``), and its nodes' rows are the *sums* of their ``n`` leaves' rows, so
    pooling is one sum and the means' ``1 / n`` goes into the products' scale. Without
    ``keep`` (no backward), a level is dropped once the top-down pass has used it.

    ``counts``: the leaf counts ``[1, F, b]`` of every level of a forest
    with masked leaves (:func:`~hiergraph.ops.hsa.uniform.counts_below`), whose rows of
    ``q, k, v`` are zero at those leaves when heads first (node-major ones weigh 0 in the
    leaves' sums); the counts then scale the logits and the products per node, a node
    without leaves is no key, and a parent's energy is the count-weighted mean of its
    children's.

    ``above`` (without ``keep``): called between the passes with the roots' energies
    ``[H, B]`` and mean ``[q, k, v]`` rows ``[H, B, ·]`` (0 at a root without leaves), it
    returns the log mass ``[H, B]`` and the output ``[H, B, d_v]`` the top-down pass starts
    from at every root."""
    depth, heads = len(fanout), q.size(1 if node_major else 0)
    rows, energy, levels = (q, k, v), None, [None] * depth
    for d in range(depth - 1, -1, -1):  # bottom-up
        b = fanout[d]
        n = math.prod(fanout[d + 1 :]) if counts is None else counts[d]
        tokens = node_major and d == depth - 1  # leaves [F, b, H, ·], logits heads first
        if tokens:
            qf, kf, vf = (token_layout.token_families(t, b) for t in rows)
            gram = token_layout.pair_gram if b == 2 else token_layout.head_gram
            logits = gram(qf, kf, tau).view(-1, b, b)
        else:
            qf, kf, vf = (t.reshape(-1, b, t.size(-1)) for t in rows)
            scale = tau / (n * n) if isinstance(n, int) else tau
            logits = family_gram(qf, kf, scale)
        # what the products divide by: n, or per node 1 / n on a masked level (at the
        # leaves, with counts 0 and 1 and zero rows where 0, nothing)
        divisor = n if isinstance(n, int) else 1 if d == depth - 1 else 1 / n.clamp(min=1)
        outer = None
        if isinstance(divisor, Tensor):  # per key [1, F, 1, b], and per logit [1, F, b, b]
            divisor = divisor.unsqueeze(-2)
            outer = divisor.transpose(-1, -2) * divisor
            logits.view(heads, -1, b, b).mul_(outer)
        e = None if eps is None else eps[d].reshape(eps[d].size(0), -1, b, eps[d].size(-1))
        if e is not None:
            logits.view(heads, -1, b, b).add_(family_gram(e, e))
        diagonal = logits.diagonal(dim1=-2, dim2=-1)
        if d == depth - 1 and include_self:
            energy = diagonal.clone()
        if isinstance(n, int):
            lse, p = _family_softmax(logits, diagonal)
            if size_bias and n > 1:  # every key's leaf count n: log n shifts the level
                lse += math.log(n)
        else:
            bias = size_bias and d < depth - 1  # a leaf counts 1: log n(B) = 0
            lse, p = _masked_family_softmax(logits, diagonal, n, heads, bias)
        levels[d] = _Level(qf, kf, vf, e, p, lse, energy, divisor, outer)
        if d or above is not None:  # the parents' energies and rows (sums)
            share = None if shares is None else shares[d]
            energy = _parent_energy(energy, lse, share, heads, include_self)
            rows = [_leaf_sum(t, n, tokens) for t in (qf, kf, vf)]
            if d:
                energy = energy.view(-1, fanout[d - 1])
    u = acc = None
    if above is not None:  # the roots' means (sums over their leaves), then the family
        roots = math.prod(fanout) if counts is None else counts[0].sum(-1)
        means = [t.view(heads, -1, t.size(-1)) / _clamped(roots) for t in rows]
        u, acc = above(energy.view(heads, -1), means)
        u, acc = u.reshape(-1, 1), acc.reshape(-1, acc.size(-1))
    for d in range(depth):  # top-down
        level = levels[d]
        p, lse, a, n = level.p, level.lse, level.energy, level.divisor
        down = u  # log mass into the family's weights, [H F, 1] or None (0)
        mu = None
        if a is not None:
            log_mu, log_rest = log_gates(a, lse, finite=counts is None or include_self)
            mu = torch.exp(log_mu)
            down = log_rest if u is None else log_rest + u
            u = log_mu if u is None else log_mu + u
        w = p if down is None else p * torch.exp(down).unsqueeze(-1)
        if not keep:  # no backward: the level is not read again
            levels[d] = None
        own = None
        if d == depth - 1 and include_self:
            own = torch.exp(u)  # a leaf's own weight e^u on the diagonal of its new w
            w.diagonal(dim1=-2, dim2=-1).copy_(own)
        level.mu, level.w, level.own = mu, w, own
        if node_major and d + 1 == depth:  # the output, in the leaves' node-major memory
            base = None if acc is None else acc.view(heads, -1, 1, acc.size(-1))
            out = _head_products(w.view(heads, -1, *w.shape[1:]), level.v, base)
            return out.flatten(0, 1), levels
        if isinstance(n, Tensor):  # a masked level's 1 / n, per key
            w, n = _per_node(w, n, heads), 1
        base = None if acc is None else acc.unsqueeze(1)
        acc = family_product(w, level.v, base, alpha=1 / n)
        if d + 1 < depth:
            acc = acc.view(-1, acc.size(-1))  # the next level's families' rows
            u = None if u is None else u.reshape(-1, 1)
    return acc.view(heads, -1, acc.size(-1)), levels


def _clamped(count):
    """Leaf counts ``[1, B]`` as ``[1, B, 1]``, at least 1, to divide sums by (an int as
    it is)."""
    return count if isinstance(count, int) else count.clamp(min=1).unsqueeze(-1)


def _leaf_sum(x: Tensor, n, tokens: bool) -> Tensor:
    """The family sums ``[H F, c]`` of a level's rows ``x`` (``[H F, b, c]``, or node-major
    leaves ``[F, b, H, c]`` with ``tokens``, whose masked rows, where the counts ``n [1, F,
    b]`` are 0, weigh 0)."""
    if not tokens:
        return family_sum(x)
    weight = None if isinstance(n, int) else n[0]
    if x.size(1) == 2:
        return token_layout.pair_sum(x, x.dtype, weight).flatten(0, 1)
    return token_layout.token_sum(x, x.dtype, weight).flatten(0, 1)


def _family_softmax(logits: Tensor, diagonal: Tensor) -> tuple[Tensor, Tensor]:
    """``lse [N, b]`` and the weights ``[N, b, b]`` of the logits ``[N, b, b]`` of families
    whose every member is a key of its siblings (the weights over ``logits``)."""
    if logits.size(-1) == 2:  # a node's one key is its sibling: no exponentials
        return family.sibling_of_two(logits)
    diagonal.fill_(float("-inf"))
    return softmax_(logits, rows_nonempty=True)


def _masked_family_softmax(
    logits: Tensor, diagonal: Tensor, n: Tensor, heads: int, size_bias: bool
) -> tuple[Tensor, Tensor]:
    r""":func:`_family_softmax` of a level with leaf counts ``n [1, F, b]``: a member without
    leaves is no key, and with ``size_bias`` a key's logits take :math:`\log n`."""
    b = logits.size(-1)
    grouped = logits.view(heads, -1, b, b)
    if b == 2:
        if size_bias:
            grouped.add_(torch.log(n.clamp(min=1)).unsqueeze(-2))
        lse, p = family.sibling_of_two(grouped, n > 0)
        return lse.reshape(-1, b), p.reshape(-1, b, b)
    diagonal.fill_(float("-inf"))
    # one key bias: log n (counts are whole numbers), or 0; -inf for a key without leaves
    grouped.add_(torch.log(n if size_bias else n.clamp(max=1)).unsqueeze(-2))
    return softmax_(logits)


def _parent_energy(energy, lse: Tensor, share, heads: int, include_self: bool) -> Tensor:
    r"""The energies :math:`a(A) = \sum_C n(C) / n(A) \log(e^{a(C)} + e^{\mathrm{lse}(C)})`
    ``[H F]`` of the parents of a level's families, from the level's energies (``None``:
    :math:`-\infty`) and ``lse`` ``[H F, b]`` and the children's shares
    (:func:`~hiergraph.ops.hsa.family.child_shares`; ``None``: equal). With self energies
    every value is finite."""
    if share is None:
        total = lse if energy is None else torch.logaddexp(energy, lse)
        return total.mean(-1)
    total = lse if energy is None else logaddexp(energy, lse, finite_a=include_self)
    total = total.view(heads, *share.shape[1:])
    finite = energy is not None and include_self
    return family.count_weighted_sum(total, share, total.dtype, finite).flatten()


def _head_products(p: Tensor, x: Tensor, base: Tensor | None, alpha: float | None = None) -> Tensor:
    """``base + alpha p_h x_h`` for every head ``h`` of heads-first weights ``p [H, F, m,
    b]``, node-major rows ``x [F, b, H, c]`` and ``base [H, F, 1, c]`` (``None``: 0),
    written node-major: ``[F, m, H, c]`` (``alpha`` as in
    :func:`~hiergraph.ops.hsa.family_products.family_product`); families of two (the
    forward alone, no ``alpha``) as :func:`~hiergraph.ops.hsa.token_layout.pair_products`."""
    if x.size(1) == 2:
        return token_layout.pair_products(p, x, base)
    rows = p.size(-2)
    return token_layout.per_head(
        lambda h: family_product(
            p[h], x[:, :, h], token_layout.head_rows(base, h, rows), alpha=alpha
        ),
        x.size(2),
        2,
    )


def _backward(grad, levels, fanout, tau, num_eps, node_major, shares=None):
    """The two sweeps of the module docstring; returns the gradients of ``q, k, v`` and of
    the position embeddings. With masked leaves (zero rows), a level above the leaves
    scales its logits and products by its nodes' :math:`1 / n` (``levels``' divisor
    tensors), and a child's share of its parent's energy is :math:`n(C) / n(A)`
    (``shares``, :func:`~hiergraph.ops.hsa.family.child_shares`)."""
    depth, heads = len(fanout), grad.size(1 if node_major else 0)
    if node_major:  # [F, b, H, d_v], read in place at the leaves
        g = token_layout.token_families(grad, fanout[-1])
    else:
        g = grad.view(-1, fanout[-1], grad.size(-1))
    du, sweep = None, [None] * depth  # du: gradient of the log mass u of the level's nodes
    for d in range(depth - 1, -1, -1):  # leaves to roots: accumulator and log mass
        level = levels[d]
        n, w, own = level.divisor, level.w, level.own
        tokens = node_major and d == depth - 1
        if tokens:
            dw = token_layout.head_gram(g, level.v).view(-1, *w.shape[1:])
        elif isinstance(n, Tensor):  # the products' 1 / n per key
            dw = _per_node(family_gram(g, level.v), n, heads)
        else:
            dw = family_gram(g, level.v, 1 / n)
        dw_w = dw.mul_(w)
        d_down = dw_w.sum(-1)  # with the leaves' own weights: d delta + du
        if own is not None:
            du = dw_w.diagonal(dim1=-2, dim2=-1).clone()
            d_down -= du
        sweep[d] = (g, dw_w, du, d_down)
        if d:
            up = d_down if du is None else d_down + du
            du = up.sum(-1).view(-1, fanout[d - 1])
            g = token_layout.token_sum(g, g.dtype) if tokens else family_sum(g)
            g = g.view(-1, fanout[d - 1], g.size(-1))
    da_parent, pooled, eps_grads = None, [None] * 3, []
    for d in range(depth):  # roots to leaves: energies, softmax, rows
        level = levels[d]
        qf, kf, e, p, a, n = level.q, level.k, level.eps, level.p, level.energy, level.divisor
        outer, mu, w, own = level.outer, level.mu, level.w, level.own
        g, ds, du, d_down = sweep[d]
        b = fanout[d]
        # the parent's energy gradient G: each child's share is g = G n(C) / n(A) (G / b
        # without a mask). With dx = du (1 - mu) - d_down mu, da = dx + g mu and
        # dlse = g (1 - mu) - dx, the softmax's shift d_down - dlse is d_down + da - g (as
        # multiply-adds)
        parent, share = None if da_parent is None else da_parent.unsqueeze(-1), 1 / b
        if parent is not None and shares is not None:
            # each child's share G n(C) / n(A)
            parent, share = _per_node(parent, shares[d], heads), 1.0
        if a is None:  # no gate: mu = 0 and lse reaches the parent's energy alone (dlse = g)
            da = None
            shift = d_down if parent is None else torch.add(d_down, parent, alpha=-share)
        else:
            dx = torch.addcmul(du, mu, du + d_down, value=-1)
            if parent is None:
                da, shift = dx, d_down + dx
            else:
                da = torch.addcmul(dx, parent, mu, value=share)
                shift = torch.add(d_down + da, parent, alpha=-share)
        ds.addcmul_(p, shift.unsqueeze(-1), value=-1)
        if own is not None:
            ds.diagonal(dim1=-2, dim2=-1).copy_(da)
        if num_eps:
            eps_grads.append(_eps_gradient(ds, e, heads))
        if isinstance(n, Tensor):  # the logits' and products' 1 / n per node
            ds, w, n = _per_node(ds, outer, heads), _per_node(w, n, heads), 1
        scale = tau / (n * n)
        if node_major and d + 1 == depth:  # node-major leaves: gradients in their layout
            ds4, w4 = ds.view(heads, -1, b, b), w.view(heads, -1, b, b)
            bases = [None if t is None else t.view(heads, -1, 1, t.size(-1)) for t in pooled]
            grads = (
                _head_products(ds4, kf, bases[0], scale),
                _head_products(ds4.transpose(-1, -2), qf, bases[1], scale),
                _head_products(w4.transpose(-1, -2), g, bases[2]),
            )
            return (*(t.flatten(0, 1) for t in grads), *eps_grads)
        dq = family_product(ds, kf, pooled[0], alpha=scale)
        dk = family_product(ds.transpose(1, 2), qf, pooled[1], alpha=scale)
        dv = family_product(w.transpose(1, 2), g, pooled[2], alpha=1 / n)
        if d + 1 < depth:
            pooled = [t.view(-1, 1, t.size(-1)) for t in (dq, dk, dv)]
            da_parent = None if da is None else da.view(-1)
    return (*(t.view(heads, -1, t.size(-1)) for t in (dq, dk, dv)), *eps_grads)


def _per_node(x: Tensor, scale: Tensor, heads: int) -> Tensor:
    """A masked level's family tensors ``x [H F, ...]`` times the per-family ``scale
    [1, F, ...]`` (broadcast over heads): its nodes' :math:`1 / n` per key ``[1, F, 1, b]``
    or per query and key ``[1, F, b, b]``, or the children's shares ``[1, F, b]``
    (:func:`~hiergraph.ops.hsa.family.child_shares`) of a parent's ``[H F, 1]``."""
    return (x.view(heads, -1, *x.shape[1:]) * scale).flatten(0, 1)


def _eps_gradient(ds: Tensor, e: Tensor, heads: int) -> Tensor:
    """The gradient ``(dS + dS^T) e`` ``[H | 1, n, c]`` of a level's position embeddings
    ``e [H | 1, F, b, c]`` from its logits' gradient ``ds [H F, b, b]`` (summed over the
    heads for an embedding shared by them)."""
    b = ds.size(-1)
    ds = ds.view(heads, -1, b, b)
    ds = ds if e.size(0) == heads else ds.sum(0, keepdim=True)
    return family_product(ds.transpose(-1, -2), e, family_product(ds, e)).flatten(1, 2)
