r"""Equal-fanout HSA as one autograd node, with its backward written out.

:func:`~hiergraph.ops.hsa.uniform.uniform_hierarchical_attention` records every level's
operations for autograd, whose backward then runs node by node: at a few thousand leaves
the bookkeeping of those nodes and their saved tensors costs as much as the products. When
no leaf is masked (every count is a constant of its level) and every node has its siblings
as keys (no ``leaky_causal``), the whole op is one node here: the forward runs the two
passes without recording and keeps what the backward reads, and the backward is two sweeps
over the levels, each a fixed handful of batched operations.

Notation (:func:`~hiergraph.ops.hierarchical_attention`; one level's families in family
layout ``[H, F, b, ·]``): logits :math:`S = \tau q k^\top + \varepsilon\varepsilon^\top`
(the diagonal left out), weights :math:`P = \mathrm{softmax}(S)`, log-partition
:math:`\ell`, energy :math:`a` (the leaves' self energies :math:`S_{ii}`, else the mean of
the children's :math:`\log(e^{a} + e^{\ell})`), gate :math:`\mu = \sigma(a - \ell)`. The
top-down pass carries the log mass :math:`u` that reaches a node; its family's weights are
:math:`W = e^{\delta} P` with :math:`\delta = u_{\uparrow} + \log(1 - \mu)`, then
:math:`u = u_{\uparrow} + \log\mu`, a leaf keeps :math:`W_{ii} = e^{u_i}`, and the output
accumulates :math:`W v` onto the parent's rows.

Backward, from the output gradient :math:`G`:

1. leaves to roots: :math:`G` of a level is the sum of its children's (the accumulator is
   broadcast down), :math:`dW = G v^\top`, :math:`d\delta = \mathrm{rowsum}(dW \odot W)`
   (off the diagonal), :math:`du = dW_{ii} e^{u_i}` at the leaves and the sum over the
   children of :math:`du + d\delta` above them;
2. roots to leaves: with :math:`x = a - \ell` and :math:`g` the parent's energy gradient
   over :math:`b`, :math:`dx = du\,(1 - \mu) - d\delta\,\mu`, :math:`da = dx + g\mu`,
   :math:`d\ell = g(1 - \mu) - dx`; the softmax gives
   :math:`dS = W \odot dW - P \odot (d\delta - d\ell)` (:math:`dS_{ii} = da_i` at the
   leaves), then :math:`dq = \tau\, dS\, k`, :math:`dk = \tau\, dS^\top q`,
   :math:`dv = W^\top G`, :math:`d\varepsilon = (dS + dS^\top)\,\varepsilon`, each plus
   the parent's gradient over :math:`b` (the pooled rows are means).

Second derivatives (``create_graph=True``) recompute the op with autograd recording and
differentiate that. Under ``torch.compile`` the recorded path is traced instead (inductor
fuses it itself).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from hiergraph.ops.hsa.family import family_gram, family_product, family_sum


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
    recorded,
) -> Tensor:
    r"""HSA of heads-first ``q, k [H, L, d]``, ``v [H, L, d_v]`` over a forest with
    ``fanout`` ``(b_1, …, b_D)`` and no masked leaf (``L`` a multiple of
    :math:`b_1 \cdots b_D`); ``eps`` per depth ``[H | 1, n_d, c]``. ``recorded`` is the
    same op with autograd recording, ``recorded(q, k, v, eps)`` (second derivatives).
    Returns ``[H, L, d_v]``."""
    eps = [] if eps is None else list(eps)
    options = (tuple(fanout), include_self, tau, size_bias, recorded)
    return _FusedUniform.apply(options, q, k, v, *eps)


class _FusedUniform(torch.autograd.Function):
    @staticmethod
    def forward(ctx, options, q, k, v, *eps):
        fanout, include_self, tau, size_bias, _ = options
        out, levels = _forward(q, k, v, eps or None, fanout, include_self, tau, size_bias)
        ctx.options, ctx.levels = options, levels
        ctx.save_for_backward(q, k, v, *eps)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        fanout, include_self, tau, _, recorded = ctx.options
        q, k, v, *eps = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the recorded op
            inputs = (q, k, v, *eps)  # the saved inputs, still part of the graph
            out = recorded(q, k, v, eps or None)
            wanted = [t for t in inputs if t.requires_grad]
            found = iter(torch.autograd.grad(out, wanted, grad, create_graph=True))
            return None, *(next(found) if t.requires_grad else None for t in inputs)
        grads = _backward(grad.contiguous(), ctx.levels, fanout, include_self, tau, len(eps))
        ctx.levels = None
        return None, *grads


def _forward(q, k, v, eps, fanout, include_self, tau, size_bias):
    """The two passes without recording; returns the output and, per level, what the
    backward reads."""
    depth = len(fanout)
    rows, energy, levels = [q, k, v], None, [None] * depth
    for d in range(depth - 1, -1, -1):  # bottom-up
        b = fanout[d]
        qf, kf, vf = (t.unflatten(1, (-1, b)) for t in rows)
        e = None if eps is None else eps[d].unflatten(1, (-1, b))
        logits = family_gram(qf, kf, tau)
        if e is not None:
            logits += family_gram(e, e)
        diagonal = logits.diagonal(dim1=-2, dim2=-1)
        if d == depth - 1 and include_self:
            energy = diagonal.clone()
        lse, p = _softmax_off_diagonal(logits, diagonal)
        n = math.prod(fanout[d + 1 :])  # every key's leaf count: log n shifts the level
        if size_bias and n > 1:
            lse += math.log(n)
        levels[d] = dict(q=qf, k=kf, v=vf, e=e, p=p, lse=lse, a=energy)
        if d:
            total = lse if energy is None else torch.logaddexp(energy, lse)
            energy = total.mean(-1).unflatten(1, (-1, fanout[d - 1]))
            rows = [t.mean(-2) for t in (qf, kf, vf)]
    u = acc = None
    for d in range(depth):  # top-down
        level = levels[d]
        p, a = level["p"], level["a"]
        down = u  # log mass into the family's weights, [H, F, 1] or None (0)
        if a is not None:
            gap = a - level["lse"]
            log_mu, log_rest = F.logsigmoid(gap), F.logsigmoid(-gap)
            level["mu"] = torch.exp(log_mu)
            down = log_rest if u is None else log_rest + u
            u = log_mu if u is None else log_mu + u
        w = p if down is None else torch.exp(down).unsqueeze(-1) * p
        if d == depth - 1 and include_self:
            w = w.clone() if w is p else w
            level["own"] = torch.exp(u)  # a leaf's own weight e^u on the diagonal
            w.diagonal(dim1=-2, dim2=-1).copy_(level["own"])
        level["w"] = w
        acc = family_product(w, level["v"], None if acc is None else acc.unsqueeze(2))
        if d + 1 < depth:
            acc = acc.flatten(1, 2)
            u = None if u is None else u.flatten(1, 2).unsqueeze(-1)
    return acc.flatten(1, 2), levels


def _softmax_off_diagonal(logits: Tensor, diagonal: Tensor) -> tuple[Tensor, Tensor]:
    """``lse [H, F, b]`` and the weights ``[H, F, b, b]`` of a family's softmax over the
    siblings (the diagonal left out), in place in ``logits``; families of two need no
    exponentials (a node's one key is its sibling)."""
    if logits.size(-1) == 2:
        lse = logits.flip(-1).diagonal(dim1=-2, dim2=-1).clone()
        swap = 1.0 - torch.eye(2, dtype=logits.dtype, device=logits.device)
        return lse, logits.copy_(swap.expand_as(logits))
    diagonal.fill_(float("-inf"))
    peak = logits.amax(-1, keepdim=True)
    p = logits.sub_(peak).exp_()
    total = p.sum(-1, keepdim=True)
    p.div_(total)
    return total.log_().add_(peak).squeeze(-1), p


def _backward(grad, levels, fanout, include_self, tau, num_eps):
    """The two sweeps of the module docstring; returns the gradients of ``q, k, v`` and of
    the position embeddings (``None`` for those that need none)."""
    depth = len(fanout)
    g = grad.unflatten(1, (-1, fanout[-1]))
    du = None  # gradient of the log mass u of the level's nodes [H, F, b]
    for d in range(depth - 1, -1, -1):  # leaves to roots: accumulator and log mass
        level = levels[d]
        w = level["w"]
        dw = family_gram(g, level["v"])
        dw_w = dw * w
        d_down = dw_w.sum(-1)  # with the leaves' own weights: d delta + du
        if d == depth - 1 and include_self:
            du = dw.diagonal(dim1=-2, dim2=-1) * level["own"]
            d_down = d_down - du
        level.update(g=g, dw_w=dw_w, du=du, d_down=d_down)
        if d:
            up = d_down if du is None else d_down + du
            du = up.sum(-1).unflatten(1, (-1, fanout[d - 1]))
            g = family_sum(g).unflatten(1, (-1, fanout[d - 1]))
    da_parent, pooled = None, None
    for d in range(depth):  # roots to leaves: energies, softmax, rows
        level, b = levels[d], fanout[d]
        p, w, mu = level["p"], level["w"], level.get("mu")
        g_energy = None if da_parent is None else da_parent.unsqueeze(-1) / b
        if level["a"] is None:  # no gate: mu = 0 and lse reaches the parent's energy alone
            da, dlse = None, g_energy
        else:
            dx = level["du"] * (1 - mu) - level["d_down"] * mu
            da = dx if g_energy is None else dx + g_energy * mu
            dlse = -dx if g_energy is None else g_energy * (1 - mu) - dx
        shift = level["d_down"] if dlse is None else level["d_down"] - dlse
        ds = level["dw_w"].sub_(p * shift.unsqueeze(-1))
        if d == depth - 1 and include_self:
            ds.diagonal(dim1=-2, dim2=-1).copy_(da)
        bases = [None] * 3 if pooled is None else [(t / b).unsqueeze(2) for t in pooled]
        dq = family_product(ds, level["k"], bases[0], alpha=tau)
        dk = family_product(ds.transpose(-1, -2), level["q"], bases[1], alpha=tau)
        dv = family_product(w.transpose(-1, -2), level["g"], bases[2])
        if num_eps:
            e = level["e"]
            ds_e = ds if e.size(0) == ds.size(0) else ds.sum(0, keepdim=True)
            level["de"] = family_product(ds_e.transpose(-1, -2), e, family_product(ds_e, e))
        if d + 1 < depth:
            pooled = [t.flatten(1, 2) for t in (dq, dk, dv)]
            da_parent = None if da is None else da.flatten(1, 2)
    eps_grads = [levels[d]["de"].flatten(1, 2) for d in range(depth)] if num_eps else []
    return (*(t.flatten(1, 2) for t in (dq, dk, dv)), *eps_grads)
