r"""Family attention of one level in dense blocks: the block kernel of the sibling attention
of :mod:`~hiergraph.ops.hsa.family`, over any forest.

:func:`family_attention_dense` runs every :class:`~hiergraph.plan.family_block.FamilyBlock`
as batched matrix products ``[F, H, W, d] @ [F, H, d, W]`` with a hand-written backward
(one autograd node per level), and on the CPU a block of :data:`WIDE_BLOCK` or more
members in PyTorch's fused attention kernel (:mod:`~hiergraph.ops.hsa.family_fused`).

Memory guard: a block whose logits ``[F, H, W, W]`` would exceed
:data:`MAX_BLOCK_ELEMENTS` (a giant family, e.g. a 15k-token "sentence") is
run in chunks of query rows, and its probabilities are recomputed chunk by
chunk in the backward instead of being stored, so its memory is
:math:`O(\text{MAX\_BLOCK\_ELEMENTS} + F H W d)` instead of
:math:`O(F H W^2)`. The result is the same: each row's softmax only needs its
own logits. A wide block in the fused kernel keeps no logits; its chunks bound the
``[F, r, W]`` logit bias (the size term and the mask) the kernel reads.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hiergraph._autograd import AutogradFunction, recorded_gradients
from hiergraph.ops.hsa.family import key_bias
from hiergraph.ops.hsa.family_fused import (
    fused_attention,
    fused_channels,
    fused_gradients,
    fused_input_gradients,
    fused_kernel_applies,
    recorded_softmax,
)
from hiergraph.ops.hsa.family_products import family_gram, family_product
from hiergraph.plan.level import Level

#: Most logits (``F * H * rows * W`` elements) one dense block builds at once (64 MiB in
#: float32); larger blocks run in chunks of query rows (see the module docstring).
MAX_BLOCK_ELEMENTS = 1 << 24


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
        lse, theta = recorded_softmax(qb, kb, vb, eb, tau, mask, bias)
        block.slots(*lse_out).copy_(lse.transpose(1, 2))
        block.slots(*theta_out).copy_(theta.transpose(1, 2))
    return level.results(*lse_out), level.results(*theta_out), *sums


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

#: A forest's wide families (:data:`WIDE_BLOCK`) *dominate* (:func:`wide_dominates`) from
#: this many (query, key) pairs per leaf on: the compiled forest kernel then leaves the
#: forest to the reshaped views or the block kernel, whose fused kernel saves more on the
#: wide blocks than the block kernel costs on the rest. Measured on window trees of 512
#: leaves beside one star of 512 to 1,024 leaves (forward+backward, 4 heads x 64, 2
#: threads): the block kernel took 1.2-1.5x the forest kernel's time at 28-45 pairs per
#: leaf, 1.03x at 57, 0.71x at 62 (the star of 1,024) and 0.4x at 205.
WIDE_PAIRS_PER_LEAF = 64


def runs_wide(width: int, q: Tensor) -> bool:
    """Whether a block of ``width`` members over rows like ``q`` runs in the fused CPU
    attention kernel (:data:`WIDE_BLOCK`,
    :func:`~hiergraph.ops.hsa.family_fused.fused_kernel_applies`)."""
    return width >= WIDE_BLOCK and fused_kernel_applies(q)


def wide_dominates(index) -> bool:
    """Whether the wide families (:data:`WIDE_BLOCK` members or more) of the forest
    ``index`` (a :class:`~hiergraph.plan.TreeIndex`) hold at least
    :data:`WIDE_PAIRS_PER_LEAF` (query, key) pairs per leaf (every star of
    :data:`WIDE_BLOCK` leaves or more does)."""
    return index.family_pairs(WIDE_BLOCK) >= WIDE_PAIRS_PER_LEAF * index.num_leaves


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
        out, lse = fused_attention(q1[:, :, rows], k1, v1, attn_mask=bias, scale=1.0)
        outs.append(out)
        raw.append(lse)  # 0 for a row without keys: its weights exp(-inf - 0) = 0
        lses.append(torch.where(has_key, lse, float("-inf")))
    out = _cat_rows(outs)
    return _cat_rows(lses), out[..., : vb.size(-1)], [q1, k1, v1, out, _cat_rows(raw)]


def _wide_backward(ctx, block, chunks, kept, keys, d_out, d_lse, sum_grads) -> list:
    """The gradients of a wide block (:func:`_block_backward`) from the fused kernel's
    backward (:func:`~hiergraph.ops.hsa.family_fused.fused_gradients`), a chunk of query rows
    at a time."""
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
    padding slot repeats its family's first member (:class:`~hiergraph.plan.family_block.
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
