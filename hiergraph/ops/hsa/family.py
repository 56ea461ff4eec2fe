r"""Sibling ("family") attention over pooled node statistics: the black box of HSA (App. E.3).

Every node :math:`C` of a level attends to its siblings :math:`B` (the other
children of its parent) with logits

.. math::
    s(C, B) = \tau\,\rho_q(C)^\top\rho_k(B) + \varepsilon(C)^\top\varepsilon(B) + \log n(B),

over the keys with :math:`n(B) > 0` (and :math:`B` left of :math:`C` with
``left_only``, the sibling masking of App. G.1). With ``size_bias=False`` the
:math:`\log n(B)` term is dropped: every sibling sub-tree weighs as one token (an
ablation; Thm. 3.2 needs the term).
Both kernels return the log-partition
:math:`\mathrm{lse}(C) = \log\sum_B e^{s(C,B)}` (``-inf`` without keys),
:math:`\vartheta(C) = \sum_B \mathrm{softmax}_B\,s(C,\cdot)\,\rho_v(B)` (0
without keys) and the level's sums of pooled queries, keys and values per parent (the
parents' rows, from the same pass):

* :func:`family_attention_dense` runs every :class:`~hiergraph.plan.tree_index.FamilyBlock`
  as batched matrix products ``[F, H, W, d] @ [F, H, d, W]`` with a
  hand-written backward (one autograd node per level), and on the CPU a block of
  :data:`WIDE_BLOCK` or more members in PyTorch's fused attention kernel;
* :func:`family_attention_edge` is a scatter softmax over the list of
  sibling pairs: the general reference path.

Memory guard: a block whose logits ``[F, H, W, W]`` would exceed
:data:`MAX_BLOCK_ELEMENTS` (a giant family, e.g. a 15k-token "sentence") is
run in chunks of query rows, and its probabilities are recomputed chunk by
chunk in the backward instead of being stored, so its memory is
:math:`O(\text{MAX\_BLOCK\_ELEMENTS} + F H W d)` instead of
:math:`O(F H W^2)`. The result is the same: each row's softmax only needs its
own logits. A wide block in the fused kernel keeps no logits; its chunks bound the
``[F, r, W]`` logit bias (the size term and the mask) the kernel reads.

The batched products over families that these kernels and the equal-fanout paths are made
of are in :mod:`~hiergraph.ops.hsa.family_products`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.utils import scatter

from hiergraph._autograd import AutogradFunction, recorded_gradients
from hiergraph.ops.hsa import native
from hiergraph.ops.hsa.family_products import family_diagonal, family_gram, family_product
from hiergraph.ops.logspace import masked_softmax, scatter_softmax
from hiergraph.ops.runs import sum_children
from hiergraph.plan.tree_index import Level

#: Most logits (``F * H * rows * W`` elements) one dense block builds at once (64 MiB in
#: float32); larger blocks run in chunks of query rows (see the module docstring).
MAX_BLOCK_ELEMENTS = 1 << 24


def key_bias(count: Tensor, size_bias: bool, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    r"""The key terms of the sibling logits: :math:`\log n(B)` (0 without the size bias)
    and the mask :math:`n(B) > 0`, for every node of a level (``count`` ``[n]``).

    The log is taken in ``count``'s dtype (float32 for half-precision inputs, see
    :func:`~hiergraph.ops.hsa.attention.hierarchical_attention`) and only then cast to ``dtype``,
    so counts past the half-precision range stay exact."""
    ok = count > 0
    bias = torch.log(count.clamp(min=1)) if size_bias else torch.zeros_like(count)
    return bias.to(dtype), ok


def child_shares(n: Tensor, denom: Tensor | None = None) -> Tensor:
    r"""The children's shares :math:`n(C) / n(A)` ``[1, F, b]`` of their parents' leaves, from
    their leaf counts ``n [1, F, b]`` and the parents' ``denom [1, F]`` (at least 1; default:
    the sum of their children's counts, at least 1). A child without leaves has share 0."""
    if denom is None:
        return n / n.sum(-1, keepdim=True).clamp(min=1)
    return n / denom.unsqueeze(-1)


def count_weighted_sum(
    total: Tensor, share: Tensor, dtype: torch.dtype, finite: bool = False
) -> Tensor:
    r""":math:`\sum_C n(C) / n(A)\, t(C)` ``[H, F]`` over the children :math:`C` of every
    parent :math:`A`, from ``total [H, F, b]`` in family layout and the children's shares
    ``share [1, F, b]`` (:func:`child_shares`), summed in ``dtype``: a parent's energy from
    its children's. Children without leaves weigh 0 whatever their value (an energy may be
    ``-inf`` there), with a zero gradient (their share is 0, and so is the value they
    enter with); ``finite``: the caller guarantees finite values (two operations instead
    of four)."""
    share = share.to(total.dtype)
    if not finite:
        total = torch.where(share > 0, total, 0.0)
    return (share * total).sum(-1, dtype=dtype)


def family_attention_dense(
    level: Level,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    eps: Tensor | None,
    count: Tensor,
    tau: float,
    *,
    left_only: bool,
    parent_level: Level,
    size_bias: bool = True,
) -> tuple[Tensor, ...]:
    r"""Family attention of one level with dense blocks.

    Args:
        level: the level's plan.
        q, k: ``[n, H, d]`` pooled (mean) queries/keys of the level's nodes.
        v: ``[n, H, d_v]`` pooled values.
        eps: optional ``[n, H or 1, c]`` position embeddings.
        count: ``[n]`` leaf counts :math:`n(\cdot)` (no gradient), in float32 for
            bf16/fp16 inputs (else in their dtype): :math:`\log n` and the weighted sums
            :math:`n(C)\rho(C)` are taken in that dtype and rounded to the inputs' dtype.
        parent_level: the previous level.
        size_bias: add :math:`\log n(B)` to the logits (HSA proper).

    Returns:
        ``lse [n, H]``, ``theta [n, H, d_v]`` and the sums
        :math:`\sum_{C \in \mathrm{chd}(A)} n(C)\rho_\bullet(C)` of the
        pooled queries, keys and values over the children of every node
        :math:`A` of the previous level (``[n_{d-1}, H, ·]``; 0 for
        leaves), i.e. the previous level's leaf sums. They come from the same
        blocks and share the backward pass.
    """
    num_parents = parent_level.size
    return _DenseFamilyAttention.apply(
        q, k, v, eps, count, level, tau, left_only, num_parents, size_bias
    )


#: Tensors :class:`_DenseFamilyAttention` saves per block, in order: the block's ``q, k,
#: v``, its softmax ``P`` (``None`` when recomputed), its position embeddings and its
#: members' leaf counts (``None`` on a level of leaves).
SAVED_PER_BLOCK = 6


class _DenseFamilyAttention(AutogradFunction):
    r"""Masked softmax attention per block (wide blocks on the CPU in PyTorch's fused
    attention kernel, :data:`WIDE_BLOCK`), with the backward of flash-attention style:

    .. math::
        dV = P^\top dO,\quad dS = P \odot \big(dO\,V^\top - \mathrm{rowsum}(P \odot dO\,V^\top)
        + d\mathrm{lse}\big),\quad dQ = \tau\, dS\, K,\quad dK = \tau\, dS^\top Q,
        \quad dE = dS\,E + dS^\top E,

    plus the gradients of the parents' sums, broadcast over each family. Blocks
    above :data:`MAX_BLOCK_ELEMENTS` run in chunks of query rows and recompute
    :math:`P` in the backward. Second derivatives (``create_graph=True``) differentiate
    the same blocks on tensor operations (:func:`_recorded_attention`).
    """

    @staticmethod
    def forward(ctx, q, k, v, eps, count, level, tau, left_only, num_parents, size_bias):
        n, heads = q.shape[:2]
        # slice blocks read the level's rows, gather blocks one gather of them; results
        # likewise, gathered back once
        inputs = [(t, level.gather(t)) for t in (q, k, v, eps)]
        lse_out = level.result_buffers(q, (heads,))
        theta_out = level.result_buffers(v, (heads, v.size(-1)))
        sums = [t.new_zeros(num_parents, *t.shape[1:]) for t in (q, k, v)]
        weighted = not level.all_leaves  # leaves: n is 0/1 and padded leaves carry zeros
        keys = key_bias(count, size_bias, q.dtype)
        saved, ctx.chunks, ctx.wide = [], [], []
        for block in level.blocks:
            # heads-first contiguous copies, reused by the backward
            qb, kb, vb = (_block_heads_first(block.slots(*t)) for t in inputs[:3])
            weight = _member_weight(block, count) if weighted else None
            for total, xb in zip(sums, (qb, kb, vb), strict=True):
                if weight is not None:  # 0 at padding slots
                    xsum = (xb * weight).sum(2)
                else:
                    xsum = xb.sum(2) if block.valid is None else _valid_sum(xb, block)
                total[block.parents] = xsum.to(total.dtype)  # float32 sums of half rows
            eb = None if eps is None else _block_heads_first(block.slots(*inputs[3]))
            wide = runs_wide(block.width, q)
            if wide:
                chunks = _row_chunks(block, heads=1)  # the logit bias: one for all heads
                members = (qb, kb, vb, eb)
                lse, theta, kept = _wide_forward(block, chunks, members, keys, tau, left_only)
            else:
                chunks = _row_chunks(block, heads)
                lse, theta = [], []
                for rows in chunks:
                    p, lse_rows = _probabilities(block, qb, kb, eb, keys, tau, left_only, rows)
                    lse.append(lse_rows)
                    theta.append(family_product(p, vb))
                lse, theta = _cat_rows(lse), _cat_rows(theta)
                # one chunk: keep P for the backward; several: recompute it there
                kept = [qb, kb, vb, p if len(chunks) == 1 else None, eb]
            block.slots(*lse_out).copy_(lse.transpose(1, 2))
            block.slots(*theta_out).copy_(theta.transpose(1, 2))
            saved += [*kept, weight]
            ctx.chunks.append(chunks)
            ctx.wide.append(wide)
        ctx.save_for_backward(*saved, count, q, k, v, eps)
        ctx.level, ctx.tau, ctx.left_only, ctx.size_bias = level, tau, left_only, size_bias
        ctx.num_parents, ctx.dtype = num_parents, q.dtype
        ctx.shapes = [t.shape if t is not None else None for t in (q, k, v, eps)]
        return level.results(*lse_out), level.results(*theta_out), *sums

    @staticmethod
    def backward(ctx, grad_lse, grad_theta, *grad_sums):
        level = ctx.level
        tensors, end = ctx.saved_tensors, SAVED_PER_BLOCK * len(level.blocks)
        saved, count, inputs = tensors[:end], tensors[end], tensors[end + 1 :]  # see forward
        if torch.is_grad_enabled():  # create_graph=True: differentiate the recorded op
            options = (count, level, ctx.tau, ctx.left_only, ctx.num_parents, ctx.size_bias)

            def recorded(q, k, v, eps):
                return _recorded_attention(q, k, v, eps, *options)

            grads = recorded_gradients(recorded, inputs, (grad_lse, grad_theta, *grad_sums))
            return *grads, None, None, None, None, None, None
        keys = key_bias(count, ctx.size_bias, ctx.dtype)
        # every node of a level is in exactly one family and every family in one block,
        # which writes all its slots: no zero fill
        d_theta = (grad_theta, level.gather(grad_theta))
        d_lse_all = (grad_lse, level.gather(grad_lse))
        grads = [
            level.result_buffers(grad_theta, shape[1:]) if shape is not None and need else None
            for shape, need in zip(ctx.shapes, ctx.needs_input_grad[:4], strict=True)
        ]
        blocks = zip(level.blocks, ctx.chunks, ctx.wide, strict=True)
        for i, (block, chunks, wide) in enumerate(blocks):
            *kept, weight = saved[SAVED_PER_BLOCK * i : SAVED_PER_BLOCK * (i + 1)]
            # d(parent sum) reaches every member, times its count
            sum_grads = [
                _weigh(g.index_select(0, block.parents).unsqueeze(2), weight) for g in grad_sums
            ]
            d_out = _block_heads_first(block.slots(*d_theta))
            d_lse = _block_heads_first(block.slots(*d_lse_all)).unsqueeze(-1)
            step = _wide_backward if wide else _block_backward
            block_grads = step(ctx, block, chunks, kept, keys, d_out, d_lse, sum_grads)
            for g, g_block in zip(grads, block_grads, strict=True):
                if g is not None:
                    block.slots(*g).copy_(g_block.transpose(1, 2))
        grads = [None if g is None else level.results(*g) for g in grads]
        return (*grads, None, None, None, None, None, None)


def _recorded_attention(q, k, v, eps, count, level, tau, left_only, num_parents, size_bias):
    """:class:`_DenseFamilyAttention` on tensor operations that autograd records (for its
    second derivatives): every block's logits at once, the softmax of
    :func:`~hiergraph.ops.logspace.masked_softmax`."""
    log_n, key_ok = key_bias(count, size_bias, q.dtype)
    inputs = [(t, level.gather(t)) for t in (q, k, v, eps)]
    lse_out = level.result_buffers(q, (q.size(1),))
    theta_out = level.result_buffers(v, (q.size(1), v.size(-1)))
    sums = [t.new_zeros(num_parents, *t.shape[1:]) for t in (q, k, v)]
    for block in level.blocks:
        qb, kb, vb = (block.slots(*t).transpose(1, 2) for t in inputs[:3])
        weight = _member_weight(block, count)  # 0 at padding slots and masked leaves
        for total, xb in zip(sums, (qb, kb, vb), strict=True):
            total[block.parents] = (xb * weight).sum(2).to(total.dtype)
        eb = None if eps is None else block.slots(*inputs[3]).transpose(1, 2)
        mask = _pair_mask(block, key_ok, left_only, slice(None))
        bias = block.rows(log_n)[:, None, None, :]
        lse, theta = _recorded_softmax(qb, kb, vb, eb, tau, mask, bias)
        block.slots(*lse_out).copy_(lse.transpose(1, 2))
        block.slots(*theta_out).copy_(theta.transpose(1, 2))
    return level.results(*lse_out), level.results(*theta_out), *sums


def _recorded_softmax(q, k, v, e, tau, mask, bias=None) -> tuple[Tensor, Tensor]:
    r"""``lse`` and ``theta`` of the logits :math:`\tau q k^\top + \varepsilon
    \varepsilon^\top` (+ ``bias``) of families ``q, k [..., b, d]``, ``v``, ``e`` (or
    ``None``) over the pairs ``mask`` keeps, on tensor operations that autograd records
    (the second derivatives of the fused kernel's callers)."""
    logits = family_gram(q, k, tau)
    if e is not None:
        logits = logits + family_gram(e, e)
    if bias is not None:
        logits = logits + bias
    lse, p = masked_softmax(logits, mask)
    return lse, family_product(p, v)


def _block_backward(ctx, block, chunks, kept, keys, d_out, d_lse, sum_grads) -> list:
    """The gradients ``[F, H, W, ·]`` of a block's ``q, k, v`` and position embeddings
    (``None`` where not needed) from those of its ``theta`` and ``lse`` and of the parents'
    sums (``sum_grads``, per member), with the weights ``P`` kept by the forward or
    recomputed per chunk of query rows."""
    qb, kb, vb, p, eb = kept
    g_q, g_k, g_v = sum_grads
    need_q, need_k, need_v, need_e = ctx.needs_input_grad[:4]
    dq_rows, de_rows, dk_b, dv_b, de_cols = [], [], g_k, g_v, 0
    for rows in chunks:
        if p is None or len(chunks) > 1:
            p = _probabilities(block, qb, kb, eb, keys, ctx.tau, ctx.left_only, rows)[0]
        d_out_r = d_out[:, :, rows]
        d_s = family_gram(d_out_r, vb)
        d_s -= (p * d_s).sum(-1, keepdim=True)
        d_s += d_lse[:, :, rows]
        d_s *= p
        if need_q:
            dq_rows.append(family_product(d_s, kb, _take_rows(g_q, rows), alpha=ctx.tau))
        if need_k:
            dk_b = family_product(d_s.transpose(-1, -2), qb[:, :, rows], dk_b, alpha=ctx.tau)
        if need_v:
            dv_b = family_product(p.transpose(-1, -2), d_out_r, dv_b)
        if need_e and eb is not None:
            d_e = d_s if eb.size(1) == d_s.size(1) else d_s.sum(1, keepdim=True)
            de_rows.append(d_e @ eb)
            de_cols = de_cols + d_e.transpose(-1, -2) @ eb[:, :, rows]
    dq = _cat_rows(dq_rows) if need_q else None
    de = _cat_rows(de_rows) + de_cols if need_e and eb is not None else None
    return [dq, dk_b if need_k else None, dv_b if need_v else None, de]


#: Narrowest block whose softmax runs in PyTorch's fused CPU attention kernel
#: (``scaled_dot_product_attention``'s flash kernel, which returns the log-partition too),
#: forward and backward: a block's logits then stay in cache, a tile at a time, where the
#: batched products write and re-read ``[F, H, W, W]`` logits and weights, and keep the
#: weights for the backward. Forward+backward of stars of 512 to 2,048 leaves (4 and 8
#: heads x 64, float32, 2 threads) took 0.6-0.9x the time of the batched products with
#: glibc's allocator, 0.94-1.12x with freed memory reused
#: (:func:`~hiergraph.runtime.reuse_freed_memory`), 0.64-0.7x where the logits outgrow
#: :data:`MAX_BLOCK_ELEMENTS` (``benchmarks/hsa_wide.py``).
WIDE_BLOCK = 512

#: A forest's wide blocks (:data:`WIDE_BLOCK`) *dominate* (:func:`wide_dominates`) from
#: this many (query, key) pairs per leaf on: the compiled forest kernel then leaves the
#: forest to the reshaped views or the block kernel, whose fused kernel saves more on the
#: wide blocks than the block kernel costs on the rest. Measured on window trees of 512
#: leaves beside one star of 512 to 1,024 leaves (forward+backward, 4 heads x 64, 2
#: threads): the block kernel took 1.2-1.5x the forest kernel's time at 28-45 pairs per
#: leaf, 1.03x at 57, 0.71x at 62 (the star of 1,024) and 0.4x at 205.
WIDE_PAIRS_PER_LEAF = 64


#: Narrowest leaf families whose left-sibling attention (the strictly causal views,
#: :mod:`~hiergraph.ops.hsa.causal_uniform`) runs in the fused kernel
#: (:func:`leaf_family_attention`): its causal tiles skip the upper half, so it pays off at
#: half the width of :data:`WIDE_BLOCK`. Forward+backward of the strictly causal op over
#: stars of 256, 128 and 64 leaves (4 heads x 64, 2 threads): 0.76x, 1.0x and 1.34x the
#: time of the reshaped views' products; trees of 2 and 4 families of 256: 0.92x, 0.85x.
WIDE_LEFT_LEAVES = 256


def fused_kernel_applies(q: Tensor) -> bool:
    """Whether wide blocks over rows like ``q`` can run in the fused CPU attention kernel:
    float32 or float64 CPU rows, eager."""
    return (
        q.device.type == "cpu"
        and q.dtype in (torch.float32, torch.float64)
        and not torch.compiler.is_compiling()
    )


def runs_wide(width: int, q: Tensor) -> bool:
    """Whether a block of ``width`` members over rows like ``q`` runs in the fused CPU
    attention kernel (:data:`WIDE_BLOCK`, :func:`fused_kernel_applies`)."""
    return width >= WIDE_BLOCK and fused_kernel_applies(q)


def wide_dominates(index) -> bool:
    """Whether the wide blocks of the forest ``index`` (a
    :class:`~hiergraph.plan.TreeIndex`) hold at least :data:`WIDE_PAIRS_PER_LEAF` pairs per
    leaf (every star of :data:`WIDE_BLOCK` leaves or more does)."""
    return index.block_pairs(WIDE_BLOCK) >= WIDE_PAIRS_PER_LEAF * index.num_leaves


_fused_attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_fused_attention_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _wide_bias(block, keys, left_only: bool, rows: slice) -> tuple[Tensor, Tensor]:
    r"""The additive logit bias ``[F, 1, r, W]`` of the query rows ``rows`` of a block
    (:math:`\log n(B)` where the pair may attend, else :math:`-\infty`) and whether each
    row has a key, ``[F, 1, r]``."""
    log_n, key_ok = keys
    ok = _pair_mask(block, key_ok, left_only, rows)
    bias = torch.where(ok, block.rows(log_n)[:, None, None, :], float("-inf"))
    return bias, ok.any(-1)


def _wide_forward(block, chunks, members, keys, tau, left_only):
    r"""``lse [F, H, W]`` and ``theta [F, H, W, d_v]`` of a wide block in the fused CPU
    attention kernel, a chunk of query rows at a time, and what its backward keeps
    (``members``: the block's heads-first ``q, k, v`` and position embeddings or ``None``).

    The kernel takes one channel count for queries, keys and values and a scale: the logits
    :math:`\tau\, q^\top k + \varepsilon^\top\varepsilon` are those of
    :math:`[\tau q, \varepsilon, 0]^\top [k, \varepsilon, 0]`, the values are
    :math:`[v, 0]`, each zero-padded to ``max(d + c, d_v) + 1`` channels (the last one
    carries the log-partition's gradient in the backward, :func:`_wide_backward`). A row
    without keys has ``lse = -inf`` and ``theta = 0``."""
    qb, kb, vb, eb = members
    q1, k1, v1 = fused_channels(qb, kb, vb, eb, tau)
    outs, lses, raw = [], [], []
    for rows in chunks:
        bias, has_key = _wide_bias(block, keys, left_only, rows)
        out, lse = _fused_attention(q1[:, :, rows], k1, v1, attn_mask=bias, scale=1.0)
        outs.append(out)
        raw.append(lse)  # 0 for a row without keys: its weights exp(-inf - 0) = 0
        lses.append(torch.where(has_key, lse, float("-inf")))
    out = _cat_rows(outs)
    return _cat_rows(lses), out[..., : vb.size(-1)], [q1, k1, v1, out, _cat_rows(raw)]


def fused_channels(q: Tensor, k: Tensor, v: Tensor, e: Tensor | None, tau: float) -> tuple:
    r"""The fused kernel's queries, keys and values for families ``q, k [..., b, d]``, ``v
    [..., b, d_v]`` with the position embeddings ``e`` (broadcastable to ``[..., b, c]``,
    or ``None``): :math:`[\tau q, \varepsilon, 0]`, :math:`[k, \varepsilon, 0]` and
    :math:`[v, 0]`, each zero-padded to ``max(d + c, d_v) + 1`` channels (the kernel takes
    one channel count, and the last one carries the log-partition's gradient in
    :func:`fused_gradients`); its scale is then 1."""
    extra = [] if e is None else [e.expand(*q.shape[:-1], e.size(-1))]
    width = max(q.size(-1) + sum(t.size(-1) for t in extra), v.size(-1)) + 1
    return _padded([q * tau, *extra], width), _padded([k, *extra], width), _padded([v], width)


def fused_gradients(d_theta, d_lse, q1, k1, v1, out, lse, bias, causal=False) -> tuple:
    r"""The gradients of :func:`fused_channels`' ``q1, k1, v1`` from those of ``theta``
    (``[..., r, d_v]``) and ``lse`` (``[..., r, 1]``), given the kernel's forward ``out,
    lse`` and its logit ``bias`` (or ``causal``). The kernel's backward computes
    :math:`dS = P \odot (dO\, V^\top - \mathrm{rowsum}(dO \odot O))` from the output
    :math:`O` it is given; the log-partition's gradient :math:`g` adds :math:`g P` to
    :math:`dS`: with :math:`dO = [d\vartheta, 0, 1]` and :math:`O = [\vartheta, 0, -g]`
    on the padded channels (whose values are 0) the row sum becomes
    :math:`d\vartheta^\top \vartheta - g`."""
    ones = d_theta.new_ones(*d_theta.shape[:-1], 1)
    grad1 = torch.cat([_padded([d_theta], q1.size(-1) - 1), ones], -1)
    out1 = torch.cat([out[..., :-1], -d_lse], -1)
    return _fused_attention_backward(
        grad1, q1, k1, v1, out1, lse, 0.0, causal, attn_mask=bias, scale=1.0
    )


def fused_input_gradients(dq1, dk1, dv1, d, d_v, e_shape, tau) -> list:
    """The gradients of :func:`fused_channels`' inputs ``q, k [..., d]``, ``v [..., d_v]``
    and of the embeddings (shape ``e_shape``, broadcast over the heads or not; ``None``: no
    embeddings) from those of its outputs (:func:`fused_gradients`)."""
    de = None
    if e_shape is not None:
        c = e_shape[-1]
        de = (dq1[..., d : d + c] + dk1[..., d : d + c]).sum_to_size(e_shape)
    return [dq1[..., :d] * tau, dk1[..., :d], dv1[..., :d_v], de]


def leaf_family_attention(
    q: Tensor, k: Tensor, v: Tensor, e: Tensor | None, tau: float, left_only: bool
) -> tuple[Tensor, Tensor]:
    r"""``lse [H, F, b]`` and ``theta [H, F, b, d_v]`` of every leaf of families of ``b >=
    2`` leaves (``q, k [H, F, b, d]``, ``v [H, F, b, d_v]``, position embeddings ``e [H | 1, F,
    b, c]`` or ``None``) over its siblings, or its left siblings only with ``left_only``,
    with the logits :math:`\tau q_i^\top k_j + \varepsilon_i^\top\varepsilon_j` (a leaf
    counts 1: no size term), in PyTorch's fused CPU attention kernel
    (:func:`fused_channels`). A leaf without a key has ``lse = -inf`` and ``theta = 0``.
    Differentiable twice: second derivatives differentiate the same softmax on tensor
    operations."""
    return _LeafFamilyAttention.apply(q, k, v, e, tau, left_only)


class _LeafFamilyAttention(AutogradFunction):
    """:func:`leaf_family_attention`. Left siblings (``left_only``) are the kernel's causal
    attention of the leaves ``1 … b - 1`` over the keys of the leaves ``0 … b - 2``: row
    ``i - 1`` of it sees the keys up to ``i - 1`` (the kernel skips the tiles above the
    diagonal, half the work, and needs no mask); the first leaf has no key."""

    @staticmethod
    def forward(ctx, q, k, v, e, tau, left_only):
        q1, k1, v1 = fused_channels(q, k, v, e, tau)
        if left_only:
            out, lse = _fused_attention(*_left_rows(q1, k1, v1), is_causal=True, scale=1.0)
            # the first leaf has no key: lse -inf, theta 0
            out, lse = F.pad(out, (0, 0, 1, 0)), F.pad(lse, (1, 0), value=-math.inf)
        else:  # b >= 2: every leaf has a sibling
            out, lse = _fused_attention(q1, k1, v1, attn_mask=_self_bias(q), scale=1.0)
        ctx.save_for_backward(q, k, v, e, q1, k1, v1, out, lse)
        ctx.tau, ctx.left_only = tau, left_only
        return lse, out[..., : v.size(-1)]

    @staticmethod
    def backward(ctx, grad_lse, grad_theta):
        q, k, v, e, q1, k1, v1, out, lse = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the recorded op
            keep = ~left_out(q.size(-2), ctx.left_only, q.device)

            def recorded(q, k, v, e):
                return _recorded_softmax(q, k, v, e, ctx.tau, keep)

            grads = recorded_gradients(recorded, (q, k, v, e), (grad_lse, grad_theta))
            return *grads, None, None
        grads = (grad_theta, grad_lse.unsqueeze(-1))
        if ctx.left_only:  # the rows of leaves 1 … b - 1, the keys of leaves 0 … b - 2
            rows = [t[..., 1:, :] for t in (*grads, out, lse.unsqueeze(-1))]
            dq1, dk1, dv1 = fused_gradients(
                *rows[:2], *_left_rows(q1, k1, v1), rows[2], rows[3].squeeze(-1), None, True
            )
            dq1 = F.pad(dq1, (0, 0, 1, 0))  # the first leaf: no key, no gradient
            dk1, dv1 = (F.pad(t, (0, 0, 0, 1)) for t in (dk1, dv1))  # the last: no one's key
        else:
            dq1, dk1, dv1 = fused_gradients(*grads, q1, k1, v1, out, lse, _self_bias(q))
        e_shape = None if e is None else e.shape
        grads = fused_input_gradients(dq1, dk1, dv1, q.size(-1), v.size(-1), e_shape, ctx.tau)
        return *grads, None, None


def _left_rows(q1: Tensor, k1: Tensor, v1: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The queries of the leaves ``1 … b - 1`` and the keys and values of the leaves ``0 …
    b - 2`` of families ``[..., b, c]``: views."""
    return q1[..., 1:, :], k1[..., :-1, :], v1[..., :-1, :]


def _self_bias(q: Tensor) -> Tensor:
    """The additive logit bias ``[b, b]`` of families ``q [..., b, d]`` that leaves every
    member itself out: ``-inf`` on the diagonal, else 0."""
    b = q.size(-2)
    return torch.zeros(b, b, dtype=q.dtype, device=q.device).fill_diagonal_(-math.inf)


def left_out(b: int, left_only: bool, device) -> Tensor:
    """``[b, b]``, true for the sibling pairs a family's softmax leaves out: a node itself,
    and with ``left_only`` its right siblings."""
    ar = torch.arange(b, device=device)
    return ar[None, :] >= ar[:, None] if left_only else ar[None, :] == ar[:, None]


def _padded(parts: list[Tensor], width: int) -> Tensor:
    """``parts`` ``[F, H, W, ·]`` joined along the channels and zero-padded to ``width``."""
    pad = width - sum(t.size(-1) for t in parts)
    return torch.cat([*parts, parts[0].new_zeros(*parts[0].shape[:-1], pad)], -1)


def _wide_backward(ctx, block, chunks, kept, keys, d_out, d_lse, sum_grads) -> list:
    """The gradients of a wide block (:func:`_block_backward`) from the fused kernel's
    backward (:func:`fused_gradients`), a chunk of query rows at a time."""
    q1, k1, v1, out, lse = kept
    dq1, dk1, dv1 = [], 0, 0
    for rows in chunks:
        bias = _wide_bias(block, keys, ctx.left_only, rows)[0]
        dq_r, dk_r, dv_r = fused_gradients(
            d_out[:, :, rows], d_lse[:, :, rows], q1[:, :, rows], k1, v1, out[:, :, rows],
            lse[:, :, rows], bias,
        )  # fmt: skip
        dq1.append(dq_r)
        dk1, dv1 = dk1 + dk_r, dv1 + dv_r
    q_shape, _, v_shape, e_shape = ctx.shapes  # e: [n, H | 1, c], in a block [F, H | 1, W, c]
    e_shape = None if e_shape is None else (block.count, e_shape[1], block.width, e_shape[2])
    grads = fused_input_gradients(
        _cat_rows(dq1), dk1, dv1, q_shape[-1], v_shape[-1], e_shape, ctx.tau
    )
    # plus the gradients of the parents' sums, which reach every member (none for e)
    return [
        None if g is None or not need else g + s
        for g, s, need in zip(grads, [*sum_grads, 0], ctx.needs_input_grad[:4], strict=True)
    ]


def _row_chunks(block, heads: int) -> list[slice]:
    """Query-row ranges of a block such that each chunk's logits over ``heads`` heads,
    ``[F, heads, r, W]``, fit in ``MAX_BLOCK_ELEMENTS``."""
    w = block.width
    rows = max(1, min(w, MAX_BLOCK_ELEMENTS // max(block.count * heads * w, 1)))
    return [slice(lo, min(lo + rows, w)) for lo in range(0, w, rows)]


def _cat_rows(parts: list[Tensor]) -> Tensor:
    """The row chunks ``[F, H, r, ...]`` of a block joined along dim 2 (no copy for one)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, 2)


def _take_rows(x: Tensor, rows: slice) -> Tensor:
    """Rows ``rows`` of dim 2 of ``x``, which may broadcast there (size 1)."""
    return x if x.size(2) == 1 else x[:, :, rows]


def _probabilities(block, qb, kb, eb, keys, tau, left_only, rows: slice) -> tuple[Tensor, Tensor]:
    """Softmax ``P [F, H, r, W]`` and ``lse [F, H, r]`` of the query rows ``rows`` of a block
    (``keys``: the level's ``log n`` and ``n > 0``)."""
    log_n, key_ok = keys
    logits = family_gram(qb[:, :, rows], kb, tau)
    if eb is not None:
        logits += family_gram(eb[:, :, rows], eb)
    logits += block.rows(log_n)[:, None, None, :]
    logits.masked_fill_(~_pair_mask(block, key_ok, left_only, rows), float("-inf"))
    lse = torch.logsumexp(logits, -1)
    p = logits.sub_(torch.where(torch.isfinite(lse), lse, 0).unsqueeze(-1)).exp_()
    return p, lse


def _weigh(g: Tensor, weight: Tensor | None) -> Tensor:
    """``g * weight`` in ``g``'s dtype (the product of half rows and float32 counts is
    rounded once)."""
    return g if weight is None else (g * weight).to(g.dtype)


def _member_weight(block, count: Tensor) -> Tensor:
    """``[F, 1, W, 1]`` leaf count of every member (0 for padding slots), in ``count``'s
    dtype."""
    weight = block.rows(count)
    if block.valid is not None:
        weight = weight * block.valid
    return weight[:, None, :, None]


def _valid_sum(xb: Tensor, block) -> Tensor:
    """Sum over the valid members of every family of a gather block: ``[F, H, ·]``. A
    padding slot repeats its family's first member (:class:`~hiergraph.plan.tree_index.
    FamilyBlock`), so this is the sum over all slots less that many copies of the first
    member: no pass over the block besides the sum."""
    padding = block.padding.to(xb.dtype)[:, None, None]
    return torch.addcmul(xb.sum(2), padding, xb[:, :, 0], value=-1)


def _block_heads_first(x: Tensor) -> Tensor:
    """``[F, W, H, ...]`` → contiguous ``[F, H, W, ...]`` (the layout of batched matmul)."""
    return x.transpose(1, 2).contiguous()


def _pair_mask(block, key_ok: Tensor, left_only: bool, rows: slice) -> Tensor:
    """``[F, 1, r, W]`` true where query slot ``a`` (in ``rows``) may attend to key slot ``b``."""
    ar = torch.arange(block.width, device=key_ok.device)
    query = ar[rows, None]
    pair = ar[None, :] < query if left_only else ar[None, :] != query
    ok = block.rows(key_ok)[:, None, None, :] & pair
    if block.valid is not None:  # padding slots attend to nothing and are never attended
        ok = ok & block.valid[:, None, None, :] & block.valid[:, None, rows, None]
    return ok


def family_attention_edge(
    level: Level,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    eps: Tensor | None,
    count: Tensor,
    tau: float,
    *,
    left_only: bool,
    parent_level: Level,
    size_bias: bool = True,
) -> tuple[Tensor, ...]:
    """Family attention of one level as a softmax over sibling pairs (same contract as
    :func:`family_attention_dense`): on the CPU one call of the compiled kernel
    (:func:`~hiergraph.ops.hsa.native.edge_softmax`, over the pairs whose key has leaves;
    second derivatives through the tensor operations below), elsewhere gathers of every
    pair's rows, a scatter softmax and a scatter of the weighted values.

    Its inputs are float32 or float64 (the general path widens bf16/fp16 ones,
    :func:`~hiergraph._precision.widened`). The rows of the pairs are gathered with
    ``index_select``, whose backward adds them in pair order (bitwise reproducible on CPU;
    ``x[index]`` would add them with unordered atomics)."""
    n = count.numel()
    query, key = level.sibling_pairs
    bias, ok = key_bias(count, size_bias, q.dtype)
    keep = ok[key] & (key < query) if left_only else ok[key]  # the pairs that attend

    def pairs(q, k, v, eps):
        logits = tau * (q.index_select(0, query) * k.index_select(0, key)).sum(-1)
        if eps is not None:
            logits = logits + (eps.index_select(0, query) * eps.index_select(0, key)).sum(-1)
        logits = (logits + bias[key].unsqueeze(-1)).masked_fill(~keep.unsqueeze(-1), -math.inf)
        lse, attn = scatter_softmax(logits, query, n)
        weighted = attn.unsqueeze(-1) * v.index_select(0, key)
        return lse, scatter(weighted, query, 0, dim_size=n, reduce="sum")

    if native.applies_to_edges(q):
        rows = None if eps is None else eps.expand(-1, q.size(1), -1)
        node = torch.arange(n, device=q.device)
        lse, theta = native.edge_softmax(
            q, k, v, bias, rows, node, query[keep], key[keep], tau, recorded=pairs
        )
    else:
        lse, theta = pairs(q, k, v, eps)
    weight = count[:, None, None]
    sums = [sum_children(t * weight, level, parent_level) for t in (q, k, v)]
    return lse, theta, *sums


def sibling_of_two(logits: Tensor, keys: Tensor | None = None) -> tuple[Tensor, Tensor]:
    r"""``lse [..., 2]`` and ``p [..., 2, 2]`` (a broadcast view) of the (biased) logits
    ``[..., 2, 2]`` of families of two without ``left_only``, as
    :func:`~hiergraph.ops.logspace.softmax_dropping` gives them: a node's one key is its
    sibling :math:`B`, whose weight is 1 and :math:`\mathrm{lse}` its logit; with ``keys``
    (broadcastable to ``[..., 2]``, false for nodes without leaves) a sibling that
    is no key gives weight 0 and :math:`\mathrm{lse} = -\infty`. No softmax passes; the
    weights are constants."""
    lse = family_diagonal(logits.flip(-1))  # s(C, sibling of C)
    swap = 1.0 - torch.eye(2, dtype=logits.dtype, device=logits.device)
    if keys is None:
        return lse, swap.expand_as(logits)
    lse = torch.where(keys.flip(-1), lse, float("-inf"))
    return lse, (swap * keys.unsqueeze(-2).to(logits.dtype)).expand_as(logits)
