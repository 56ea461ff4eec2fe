r"""Triton kernels of equal-fanout HSA: each pass of
:mod:`~hiergraph.ops.hsa.uniform_fused` over one level is one launch, one program per
(family, head).

The notation is that of :mod:`~hiergraph.ops.hsa.uniform_fused`: a level's node rows are
the *sums* of their :math:`n` leaves' rows, its logits are
:math:`S_{ij} = \tau \bar q_i^\top \bar k_j / (n_i n_j)` (the diagonal left out of the
softmax), and :math:`P`, :math:`\ell`, :math:`a`, :math:`\mu`, :math:`u`, :math:`W` are its
weights, log-partitions, energies, gates, log masses and gated weights. A program loads its
family's ``b`` member rows in chunks of ``CH`` channels, holds the ``[b, b]`` logits and
weights in registers and writes what the next level's program reads: the parent's sums
and energy going up, each member's log mass and output accumulator going down. The
arithmetic runs in the dtype of the saved buffers (``p_ptr``): float32 for float32,
bfloat16 and float16 rows, float64 for float64.

Rows are addressed as ``base + node * row_stride + head * head_stride + channel``: the
leaves' rows where the inputs lie (``[L, H, C]`` with any row and head strides), the
levels above in ``[H, N, C]`` buffers. Per-node values (:math:`\ell`, :math:`a`,
:math:`u`, gradients) are ``[H, N]`` buffers, weights ``[H, N, b]``.

The flags, fixed per launch: ``LEAVES`` (the level is the leaves), ``GATE`` (its nodes
have energies: every level but leaves without self energies), ``OWN`` (leaves with self
energies, whose own weight :math:`e^u` sits on the diagonal of :math:`W`), ``TOP`` (the
roots' families: no parent), ``PARENT`` (the bottom-up pass writes a level above),
``EPS`` (the level has position embeddings ``[H | 1, N, CE]``; head stride 0 when the heads
share them), ``MASK`` (its nodes' leaf counts :math:`n` come from ``n_ptr``: a leaf mask) and
``ZERO`` (masked leaves: their rows are read as zero, their outputs and gradients written as
zero). With a mask, a node without valid leaves is no key, its share of its parent's energy
is 0, and a node without keys has :math:`\ell = -\infty` and weights 0. The leaf count
``n_leaves`` is never specialised (a count of 1 would become a constant).

``TRITON_INTERPRET=1`` runs these kernels on CPU tensors (the tests do); it must be set
before Triton is first imported.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _logsigmoid(x):
    return tl.minimum(x, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(x)))


@triton.jit
def _logaddexp(x, y):
    r""":math:`\log(e^x + e^y)`, :math:`-\infty` where both are."""
    top = tl.maximum(x, y)
    finite = top != float("-inf")
    gap = tl.where(finite, -tl.abs(x - y), 0.0)
    return tl.where(finite, top + tl.log(1.0 + tl.exp(gap)), top)


@triton.jit
def _program(n_ptr, p_ptr, n_leaves, B: tl.constexpr, BB: tl.constexpr, MASK: tl.constexpr):
    """This program's family ``f`` and head ``h`` (int64), the family's members ``i``
    (padded to ``BB``), their validity, node indices (int64) and leaf counts
    (:func:`_counts`, in the dtype of ``p_ptr``)."""
    f, h = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i = tl.arange(0, BB)
    valid = i < B
    node = f.to(tl.int64) * B + i
    zero = tl.zeros((BB,), dtype=p_ptr.dtype.element_ty)
    count, inv = _counts(n_ptr, node, valid, zero, n_leaves, MASK)
    return f, h, i, valid, node, count, inv


@triton.jit
def _counts(n_ptr, node, valid, zero, n_leaves, MASK: tl.constexpr):
    r"""The members' leaf counts :math:`n` and :math:`1 / \max(n, 1)` (``[BB]``, the dtype
    of ``zero``): from ``n_ptr`` with ``MASK``, else ``n_leaves`` each (0 past ``B``)."""
    if MASK:
        count = tl.load(n_ptr + node, mask=valid, other=0.0) + zero
    else:
        count = tl.where(valid, zero + n_leaves, zero)
    return count, 1.0 / tl.maximum(count, 1.0)


@triton.jit
def _shares(count):
    """The members' shares :math:`n(C) / n(A)` of their parent's leaves (0 for all where the
    parent has none)."""
    return count / tl.maximum(tl.sum(count, 0), 1.0)


@triton.jit
def _weights(p, lse, a, u_parent, diag, GATE: tl.constexpr, OWN: tl.constexpr):
    r"""The gated weights :math:`W = e^{u_\uparrow + \log(1 - \mu)} P` (the leaves' own
    weight :math:`e^u` on the diagonal with ``OWN``), the gates :math:`\mu` and the log
    masses :math:`u = u_\uparrow + \log\mu` of a family; without ``GATE`` (leaves without
    self energies) :math:`\mu = 0`. Where :math:`a` and :math:`\ell` are both
    :math:`-\infty` (no mass reaches the node or its family), both logs are."""
    if GATE:
        none = (a == float("-inf")) & (lse == float("-inf"))
        gap = tl.where(none, 0.0, a - lse)
        log_mu = tl.where(none, float("-inf"), _logsigmoid(gap))
        down = u_parent + tl.where(none, float("-inf"), _logsigmoid(-gap))
        u = u_parent + log_mu
        mu = tl.exp(log_mu)
    else:
        mu = tl.zeros_like(lse)
        down = u_parent + mu
        u = down
    w = p * tl.exp(down)[:, None]
    if OWN:
        w = tl.where(diag, tl.exp(u)[:, None], w)
    return w, mu, u


@triton.jit
def _energies(ptr, h, N, node, valid, otherwise, GATE: tl.constexpr):
    """A level's per-node values ``[BB]`` in ``ptr`` where its nodes have gates (``GATE``),
    else ``otherwise`` (never read)."""
    if GATE:
        out = tl.load(ptr + h * N + node, mask=valid, other=0.0)
    else:
        out = otherwise
    return out


@triton.jit
def _gated(
    p_ptr, lse_ptr, energy_ptr, parent_u_ptr, h, f, i, valid, node, N,
    B: tl.constexpr, GATE: tl.constexpr, OWN: tl.constexpr, TOP: tl.constexpr,
):  # fmt: skip
    """A family's saved weights :math:`P` and log-partitions, and its gated weights, gates
    and log masses (:func:`_weights`) from its energies and its parent's log mass (0 at
    the ``TOP``)."""
    pair = valid[:, None] & valid[None, :]
    p = tl.load(p_ptr + (h * N + node)[:, None] * B + i[None, :], mask=pair, other=0.0)
    lse = tl.load(lse_ptr + h * N + node, mask=valid, other=0.0)
    a = _energies(energy_ptr, h, N, node, valid, lse, GATE)
    u_parent = 0.0 if TOP else tl.load(parent_u_ptr + h * (N // B) + f)
    w, mu, u = _weights(p, lse, a, u_parent, i[:, None] == i[None, :], GATE, OWN)
    return p, lse, w, mu, u


@triton.jit
def _rows(ptr, node, head, row_stride, head_stride, c, valid, cm):
    """Rows ``node`` (``[BB]``) of one head, channels ``c`` (``[CH]``): ``[BB, CH]``."""
    offsets = node[:, None] * row_stride + head * head_stride + c[None, :]
    return tl.load(ptr + offsets, mask=valid[:, None] & cm[None, :], other=0.0)


@triton.jit
def _level_rows(ptr, node, head, row_stride, head_stride, c, valid, cm, live, ZERO: tl.constexpr):
    """:func:`_rows` in ``live``'s dtype, those of masked leaves zero with ``ZERO``."""
    x = _rows(ptr, node, head, row_stride, head_stride, c, valid, cm).to(live.dtype)
    if ZERO:
        x = x * live[:, None]
    return x


@triton.jit
def _store_rows(ptr, x, node, head, row_stride, head_stride, c, valid, cm):
    offsets = node[:, None] * row_stride + head * head_stride + c[None, :]
    tl.store(ptr + offsets, x.to(ptr.dtype.element_ty), mask=valid[:, None] & cm[None, :])


@triton.jit(do_not_specialize=["n_leaves"])
def up_kernel(
    q_ptr, k_ptr, v_ptr, q_row, q_head, k_row, k_head, v_row, v_head,
    e_ptr, e_row, e_head, n_ptr, tau_ptr, energy_ptr, p_ptr, lse_ptr,
    sum_q_ptr, sum_k_ptr, sum_v_ptr, parent_energy_ptr,
    N, C, CV, CE, n_leaves,
    B: tl.constexpr, BB: tl.constexpr, CH: tl.constexpr,
    LEAVES: tl.constexpr, GATE: tl.constexpr, OWN: tl.constexpr, PARENT: tl.constexpr,
    SIZE_BIAS: tl.constexpr, EPS: tl.constexpr, MASK: tl.constexpr, ZERO: tl.constexpr,
):  # fmt: skip
    r"""Bottom-up pass over one level, family ``program_id(0)`` of head ``program_id(1)``:
    the logits :math:`S_{ij} = \tau \bar q_i^\top \bar k_j / (n_i n_j)` (with ``EPS``, plus
    the position energies :math:`\varepsilon_i^\top \varepsilon_j` of the rows of
    ``e_ptr``), the weights :math:`P` and log-partitions :math:`\ell` over the keys
    :math:`j \ne i` with :math:`n_j > 0` (each with the bias :math:`\log n_j` with
    ``SIZE_BIAS``); at the leaves with ``OWN`` the self energies :math:`a = S_{ii}` (into
    ``energy_ptr``); with ``PARENT`` the parent's row sums and energy
    :math:`\sum_i n_i / n(A) \log(e^{a_i} + e^{\ell_i})`."""
    f, h, i, valid, node, count, inv = _program(n_ptr, p_ptr, n_leaves, B, BB, MASK)
    dt = p_ptr.dtype.element_ty
    families = N // B
    parent_row = (h * families + f) * C
    s = tl.zeros((BB, BB), dtype=dt)
    for c0 in range(0, C, CH):
        c = c0 + tl.arange(0, CH)
        cm = c < C
        qi = _level_rows(q_ptr, node, h, q_row, q_head, c, valid, cm, count, ZERO)
        kj = _level_rows(k_ptr, node, h, k_row, k_head, c, valid, cm, count, ZERO)
        s += tl.sum(qi[:, None, :] * kj[None, :, :], axis=2)
        if PARENT:
            tl.store(sum_q_ptr + parent_row + c, tl.sum(qi, 0), mask=cm)
            tl.store(sum_k_ptr + parent_row + c, tl.sum(kj, 0), mask=cm)
    s = s * tl.load(tau_ptr).to(dt) * (inv[:, None] * inv[None, :])
    if EPS:  # the position energies e_i e_j, diagonal included (the leaves' self energies)
        for c0 in range(0, CE, CH):
            c = c0 + tl.arange(0, CH)
            cm = c < CE
            ei = _rows(e_ptr, node, h, e_row, e_head, c, valid, cm).to(dt)
            s += tl.sum(ei[:, None, :] * ei[None, :, :], axis=2)
    diag = i[:, None] == i[None, :]
    keys = (count > 0)[None, :] & (i[:, None] != i[None, :])
    if SIZE_BIAS:
        biased = s + tl.log(tl.maximum(count, 1.0))[None, :]
    else:
        biased = s
    s_keys = tl.where(keys, biased, float("-inf"))
    top = tl.max(s_keys, 1)
    top = tl.where(top == float("-inf"), 0.0, top)  # a node without keys: P = 0, lse = -inf
    e = tl.exp(s_keys - top[:, None])
    z = tl.sum(e, 1)
    p = e / tl.where(z > 0, z, 1.0)[:, None]
    lse = top + tl.log(z)
    weights = (h * N + node)[:, None] * B + i[None, :]
    tl.store(p_ptr + weights, p, mask=valid[:, None] & valid[None, :])
    tl.store(lse_ptr + h * N + node, lse, mask=valid)
    if OWN:
        a = tl.sum(tl.where(diag, s, 0.0), 1)
        tl.store(energy_ptr + h * N + node, a, mask=valid)
    elif GATE:
        a = tl.load(energy_ptr + h * N + node, mask=valid, other=0.0)
    if PARENT:
        if GATE:
            total = _logaddexp(a, lse)
        else:
            total = lse
        share = _shares(count)
        energy = tl.sum(share * tl.where(share > 0, total, 0.0), 0)
        tl.store(parent_energy_ptr + h * families + f, energy)
        parent_row = (h * families + f) * CV
        for c0 in range(0, CV, CH):
            c = c0 + tl.arange(0, CH)
            cm = c < CV
            vi = _level_rows(v_ptr, node, h, v_row, v_head, c, valid, cm, count, ZERO)
            tl.store(sum_v_ptr + parent_row + c, tl.sum(vi, 0), mask=cm)


@triton.jit(do_not_specialize=["n_leaves"])
def down_kernel(
    v_ptr, v_row, v_head, n_ptr, p_ptr, lse_ptr, energy_ptr, parent_u_ptr, parent_acc_ptr,
    u_ptr, out_ptr, out_row, out_head,
    N, CV, n_leaves,
    B: tl.constexpr, BB: tl.constexpr, CH: tl.constexpr,
    LEAVES: tl.constexpr, GATE: tl.constexpr, OWN: tl.constexpr, TOP: tl.constexpr,
    MASK: tl.constexpr, ZERO: tl.constexpr,
):  # fmt: skip
    r"""Top-down pass over one level: the gated weights :math:`W` of family
    ``program_id(0)`` of head ``program_id(1)`` from the parent's log mass, each member's
    log mass :math:`u` (into ``u_ptr``, above the leaves) and its output accumulator, the
    parent's plus :math:`\sum_j W_{ij} \bar v_j / n_j` (into ``out_ptr``: a buffer above
    the leaves, the output at them, 0 at masked leaves with ``ZERO``)."""
    f, h, i, valid, node, count, inv = _program(n_ptr, p_ptr, n_leaves, B, BB, MASK)
    families = N // B
    _, _, w, _, u = _gated(
        p_ptr, lse_ptr, energy_ptr, parent_u_ptr, h, f, i, valid, node, N, B, GATE, OWN, TOP
    )
    if not LEAVES:
        tl.store(u_ptr + h * N + node, u, mask=valid)
    w = w * inv[None, :]
    parent_row = (h * families + f) * CV
    for c0 in range(0, CV, CH):
        c = c0 + tl.arange(0, CH)
        cm = c < CV
        vj = _level_rows(v_ptr, node, h, v_row, v_head, c, valid, cm, count, ZERO)
        acc = tl.sum(w[:, :, None] * vj[None, :, :], axis=1)
        if not TOP:
            acc += tl.load(parent_acc_ptr + parent_row + c, mask=cm, other=0.0)[None, :]
        if ZERO:
            acc = acc * count[:, None]
        if LEAVES:
            _store_rows(out_ptr, acc, node, h, out_row, out_head, c, valid, cm)
        else:
            _store_rows(out_ptr, acc, node, h, CV, N * CV, c, valid, cm)


@triton.jit(do_not_specialize=["n_leaves"])
def grad_up_kernel(
    g_ptr, g_row, g_head, v_ptr, v_row, v_head, n_ptr, p_ptr, lse_ptr, energy_ptr,
    parent_u_ptr, du_ptr, dw_ptr, d_down_ptr, parent_g_ptr, parent_du_ptr,
    N, CV, n_leaves,
    B: tl.constexpr, BB: tl.constexpr, CH: tl.constexpr,
    LEAVES: tl.constexpr, GATE: tl.constexpr, OWN: tl.constexpr, TOP: tl.constexpr,
    MASK: tl.constexpr, ZERO: tl.constexpr,
):  # fmt: skip
    r"""First backward sweep (leaves to roots) over one level, from the output gradient
    :math:`G` of its nodes (the sums of their leaves', 0 at masked leaves):
    :math:`X_{ij} = W_{ij} G_i^\top \bar v_j / n_j` (into ``dw_ptr``), :math:`d\delta`,
    the row sums of :math:`X` off the diagonal (``d_down_ptr``), the leaves'
    :math:`du = X_{ii}` with ``OWN`` (``du_ptr``), and, below the top, the parent's
    :math:`G` and :math:`du = \sum_i d\delta_i + du_i`."""
    f, h, i, valid, node, count, inv = _program(n_ptr, p_ptr, n_leaves, B, BB, MASK)
    dt = p_ptr.dtype.element_ty
    families = N // B
    _, _, w, _, _ = _gated(
        p_ptr, lse_ptr, energy_ptr, parent_u_ptr, h, f, i, valid, node, N, B, GATE, OWN, TOP
    )
    pair = valid[:, None] & valid[None, :]
    diag = i[:, None] == i[None, :]
    dw = tl.zeros((BB, BB), dtype=dt)
    parent_row = (h * families + f) * CV
    for c0 in range(0, CV, CH):
        c = c0 + tl.arange(0, CH)
        cm = c < CV
        gi = _level_rows(g_ptr, node, h, g_row, g_head, c, valid, cm, count, ZERO)
        vj = _level_rows(v_ptr, node, h, v_row, v_head, c, valid, cm, count, ZERO)
        dw += tl.sum(gi[:, None, :] * vj[None, :, :], axis=2)
        if not TOP:
            tl.store(parent_g_ptr + parent_row + c, tl.sum(gi, 0), mask=cm)
    x = dw * w * inv[None, :]
    tl.store(dw_ptr + (h * N + node)[:, None] * B + i[None, :], x, mask=pair)
    d_down = tl.sum(x, 1)
    if OWN:
        du = tl.sum(tl.where(diag, x, 0.0), 1)
        d_down -= du
        tl.store(du_ptr + h * N + node, du, mask=valid)
    elif LEAVES:
        du = tl.zeros_like(d_down)
    else:
        du = tl.load(du_ptr + h * N + node, mask=valid, other=0.0)
    tl.store(d_down_ptr + h * N + node, d_down, mask=valid)
    if not TOP:
        up = tl.sum(tl.where(valid, d_down + du, 0.0), 0)
        tl.store(parent_du_ptr + h * families + f, up)


@triton.jit(do_not_specialize=["n_leaves"])
def grad_down_kernel(
    q_ptr, k_ptr, g_ptr, q_row, q_head, k_row, k_head, g_row, g_head,
    e_ptr, e_row, e_head, n_ptr, tau_ptr, p_ptr, lse_ptr, energy_ptr, parent_u_ptr, du_ptr,
    dw_ptr, d_down_ptr, parent_da_ptr, parent_dq_ptr, parent_dk_ptr, parent_dv_ptr, da_ptr,
    dq_ptr, dk_ptr, dv_ptr, de_ptr, dq_row, dq_head, dk_row, dk_head, dv_row, dv_head,
    N, C, CV, CE, n_leaves,
    B: tl.constexpr, BB: tl.constexpr, CH: tl.constexpr,
    LEAVES: tl.constexpr, GATE: tl.constexpr, OWN: tl.constexpr, TOP: tl.constexpr,
    EPS: tl.constexpr, MASK: tl.constexpr, ZERO: tl.constexpr,
):  # fmt: skip
    r"""Second backward sweep (roots to leaves) over one level: with the parent's energy
    gradient shared out over the children, :math:`g_i = g\, n_i / n(A)`,
    :math:`dx = du (1 - \mu) - d\delta\,\mu`, :math:`da = dx + g_i \mu` (into ``da_ptr``
    above the leaves), the logits' gradient :math:`dS = X - P \odot (d\delta + da - g_i)`
    (:math:`dS_{ii} = da_i` at the leaves with ``OWN``; with ``EPS``, the position
    embeddings' gradient :math:`(dS + dS^\top)\,\varepsilon` per head into ``de_ptr``),
    then :math:`d\bar q_i = \tau \sum_j dS_{ij} \bar k_j / (n_i n_j)`,
    :math:`d\bar k_j = \tau \sum_i dS_{ij} \bar q_i / (n_i n_j)`,
    :math:`d\bar v_j = \sum_i W_{ij} G_i / n_j`, each plus the parent's (the rows are
    sums): into buffers above the leaves, the inputs' gradients at them (0 at masked
    leaves with ``ZERO``)."""
    f, h, i, valid, node, count, inv = _program(n_ptr, p_ptr, n_leaves, B, BB, MASK)
    dt = p_ptr.dtype.element_ty
    families = N // B
    p, _, w, mu, _ = _gated(
        p_ptr, lse_ptr, energy_ptr, parent_u_ptr, h, f, i, valid, node, N, B, GATE, OWN, TOP
    )
    pair = valid[:, None] & valid[None, :]
    x = tl.load(dw_ptr + (h * N + node)[:, None] * B + i[None, :], mask=pair, other=0.0)
    d_down = tl.load(d_down_ptr + h * N + node, mask=valid, other=0.0)
    du = _energies(du_ptr, h, N, node, valid, d_down, GATE)
    g_share = 0.0 if TOP else tl.load(parent_da_ptr + h * families + f) * _shares(count)
    diag = i[:, None] == i[None, :]
    if GATE:
        dx = du - mu * (du + d_down)
        da = dx + g_share * mu
        shift = d_down + da - g_share
        if not LEAVES:
            tl.store(da_ptr + h * N + node, da, mask=valid)
    else:
        shift = d_down - g_share
    ds = x - p * shift[:, None]
    if OWN:
        ds = tl.where(diag, da[:, None], ds)
    if EPS:  # the position embeddings' gradient (dS + dS^T) e, into [H, N, CE]
        for c0 in range(0, CE, CH):
            c = c0 + tl.arange(0, CH)
            cm = c < CE
            ej = _rows(e_ptr, node, h, e_row, e_head, c, valid, cm).to(dt)
            de = tl.sum(ds[:, :, None] * ej[None, :, :], axis=1)
            de += tl.sum(ds[:, :, None] * ej[:, None, :], axis=0)
            _store_rows(de_ptr, de, node, h, CE, N * CE, c, valid, cm)
    ds = ds * tl.load(tau_ptr).to(dt) * (inv[:, None] * inv[None, :])
    w = w * inv[None, :]
    parent_row = (h * families + f) * C
    for c0 in range(0, C, CH):
        c = c0 + tl.arange(0, CH)
        cm = c < C
        qi = _level_rows(q_ptr, node, h, q_row, q_head, c, valid, cm, count, ZERO)
        kj = _level_rows(k_ptr, node, h, k_row, k_head, c, valid, cm, count, ZERO)
        dq = tl.sum(ds[:, :, None] * kj[None, :, :], axis=1)
        dk = tl.sum(ds[:, :, None] * qi[:, None, :], axis=0)
        if not TOP:
            dq += tl.load(parent_dq_ptr + parent_row + c, mask=cm, other=0.0)[None, :]
            dk += tl.load(parent_dk_ptr + parent_row + c, mask=cm, other=0.0)[None, :]
        if ZERO:
            dq, dk = dq * count[:, None], dk * count[:, None]
        _store_rows(dq_ptr, dq, node, h, dq_row, dq_head, c, valid, cm)
        _store_rows(dk_ptr, dk, node, h, dk_row, dk_head, c, valid, cm)
    parent_row = (h * families + f) * CV
    for c0 in range(0, CV, CH):
        c = c0 + tl.arange(0, CH)
        cm = c < CV
        gi = _level_rows(g_ptr, node, h, g_row, g_head, c, valid, cm, count, ZERO)
        dv = tl.sum(w[:, :, None] * gi[:, None, :], axis=0)
        if not TOP:
            dv += tl.load(parent_dv_ptr + parent_row + c, mask=cm, other=0.0)[None, :]
        if ZERO:
            dv = dv * count[:, None]
        _store_rows(dv_ptr, dv, node, h, dv_row, dv_head, c, valid, cm)
