r"""Blocked dense kernels for banded (sliding-window, causal-window, dilated and
block-diagonal) attention masks.

A *band* over a sequence that is cut into contiguous segments lets query
:math:`i` attend key :math:`j` iff

.. math::
    \operatorname{seg}(i) = \operatorname{seg}(j), \qquad
    (i - j) \equiv 0 \pmod{s}, \qquad
    -a\,s \;\le\; i - j \;\le\; b\,s,

with ``before`` :math:`= b` keys to the left, ``after`` :math:`= a` keys to the
right and ``dilation`` :math:`= s`. Sliding windows (:math:`a = b = p`), causal
windows (:math:`a = 0`), causal and full attention (:math:`b, a \ge n - 1`),
block-diagonal masks (one segment per block, :math:`a = b = \max` block
length - 1) and dilated/strided windows (:math:`s > 1`) are all bands.

:func:`banded_attention` computes

.. math::
    o_i = \sum_{j \in \mathcal{N}(i)}
        \operatorname{softmax}_{j \in \mathcal{N}(i)}\!\big(\lambda\, q_i^\top k_j\big)\, v_j

without ever forming the :math:`N \times N` score matrix: the queries are cut
into blocks of ``block_size`` rows, each block attends one contiguous window of
``block_size + before + after`` keys (a dense
:func:`~torch.nn.functional.scaled_dot_product_attention` call per batch of
blocks), and the backward pass recomputes chunk after chunk instead of storing
the gathered key windows, accumulating gradients in place. Work and memory
are :math:`O(N\,(B + b + a)\,H\,C)` instead of :math:`O(N^2 H)`.

:func:`banded_attention_reference` is the dense :math:`O(N^2)` oracle that the
blocked kernel is tested against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from hiergraph._autograd import AutogradFunction, differentiable_once
from hiergraph._checks import check_int, check_probability, check_qkv_like
from hiergraph._device import host_tensor


def segment_ids(lengths: Sequence[int], device: torch.device | None = None) -> Tensor:
    """Segment id of every position, ``[sum(lengths)]`` (``0`` for the first segment)."""
    lengths = [int(n) for n in lengths]
    counts = host_tensor(lengths, device)  # no blocking host-to-device copy
    ids = torch.arange(len(lengths), device=device)
    return torch.repeat_interleave(ids, counts, output_size=sum(lengths))  # no host sync


def band_predicate(
    query: Tensor, key: Tensor, segment: Tensor, before: int, after: int, dilation: int = 1
) -> Tensor:
    """Whether ``query`` may attend ``key`` under the band (module docstring).

    Args:
        query, key: broadcastable LongTensors of global positions in ``[0, N)``.
        segment: ``[N]`` segment id of every position (segments are contiguous).
        before, after, dilation: the band (``before, after >= 0``, ``dilation >= 1``).

    Returns:
        BoolTensor of the broadcast shape of ``query`` and ``key``.
    """
    offset = query - key
    return (
        (segment[query] == segment[key])
        & (offset % dilation == 0)
        & (offset <= before * dilation)
        & (offset >= -after * dilation)
    )


def _check_band(q: Tensor, k: Tensor, v: Tensor, lengths, before, after, dilation) -> list[int]:
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(
            "q, k, v must be [N, heads, channels]; got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[:2] != k.shape[:2] or k.shape[:2] != v.shape[:2] or q.size(-1) != k.size(-1):
        raise ValueError(
            "q, k, v must share N and heads, and q, k the channel size; got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    check_qkv_like(q, k, v)
    check_int(before, "before", minimum=0)
    check_int(after, "after", minimum=0)
    check_int(dilation, "dilation")
    n = q.size(0)
    if isinstance(lengths, Tensor):  # (truth-testing a tensor of lengths raised)
        lengths = lengths.tolist()
    for length in () if lengths is None else lengths:
        check_int(length, "every segment length", minimum=0)
    lengths = [n] if lengths is None else [int(length) for length in lengths]
    if any(length < 0 for length in lengths) or sum(lengths) != n:
        raise ValueError(f"segment lengths must be >= 0 and sum to N = {n}; got sum {sum(lengths)}")
    return lengths


def clamped_band(lengths, before: int, after: int, dilation: int) -> tuple[int, int, int]:
    """``(before, after, dilation)`` of the same band with no reach past the longest segment
    of ``lengths``: ``before`` and ``after`` at most ``(n - 1) // dilation``, and a dilation
    that leaves only the diagonal set to 1 (a width or dilation of ``10**7`` over 3 tokens
    built candidates in proportion to it)."""
    reach = max(lengths, default=0) - 1  # the longest offset inside a segment
    if reach < 0:
        return before, after, dilation
    before, after = min(before, reach // dilation), min(after, reach // dilation)
    return before, after, dilation if before or after else 1


def _undilate(lengths: list[int], dilation: int, device) -> tuple[Tensor, list[int]]:
    """Reorder positions so that each residue class of each segment is contiguous.

    A dilated band is a plain (``dilation = 1``) band on each class
    ``{i in segment : local(i) % dilation == r}``. Returns the order ``[N]``
    (new position -> old position) and the class lengths.
    """
    seg = segment_ids(lengths, device)
    starts = torch.tensor([0, *lengths], device=device).cumsum(0)[:-1]
    local = torch.arange(seg.numel(), device=device) - starts[seg]
    cls = seg * dilation + local % dilation
    order = torch.argsort(cls, stable=True)
    class_lengths = torch.bincount(cls, minlength=len(lengths) * dilation)
    return order, [int(c) for c in class_lengths.tolist() if c > 0]


class _Blocking:
    """Query blocks of ``block`` rows, each attending one window of ``window``
    consecutive keys; blocks are processed ``per_chunk`` at a time."""

    def __init__(self, lengths, n, before, after, block_size, chunk_size, device):
        self.n, self.before, self.after = n, before, after
        self.block = min(n, block_size or min(128, max(32, (before + after) // 2)))
        self.window = min(n, self.block + before + after)
        num_blocks = -(-n // self.block)
        blocks = torch.arange(num_blocks, device=device)
        # the window of block b covers [b B - before, (b + 1) B - 1 + after], clamped into [0, n)
        self.key_start = (blocks * self.block - before).clamp(0, n - self.window)
        self.segment = segment_ids(lengths, device)
        per_chunk = max(1, chunk_size // self.block)
        # chunk bounds stay Python ints: slicing outputs by them needs no host sync
        self.chunks = [
            range(b, min(b + per_chunk, num_blocks)) for b in range(0, num_blocks, per_chunk)
        ]

    def positions(self, chunk: range) -> tuple[Tensor, Tensor, Tensor, slice]:
        """For the ``G`` blocks of ``chunk``: query positions ``[G, B]`` (rows past
        the end repeat the last query), key positions ``[G, W]``, the mask
        ``[G, 1, B, W]`` and the output rows they fill."""
        blocks = torch.arange(chunk.start, chunk.stop, device=self.key_start.device)
        offsets = torch.arange(self.block, device=blocks.device)
        qpos = (blocks[:, None] * self.block + offsets).clamp(max=self.n - 1)
        kpos = self.key_start[blocks, None] + torch.arange(self.window, device=blocks.device)
        allowed = band_predicate(qpos[:, :, None], kpos[:, None, :], self.segment, self.before,
                                 self.after)  # fmt: skip
        rows = slice(chunk.start * self.block, min(self.n, chunk.stop * self.block))
        return qpos, kpos, allowed[:, None], rows


def _attend(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, scale, dropout_p, seed) -> Tensor:
    """Dense attention of gathered blocks: ``q [G, B, H, C]``, ``k, v [G, W, H, C]``
    -> ``[G * B, H, C_v]``; dropout draws from a generator seeded with ``seed``."""

    def attend() -> Tensor:
        return F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            attn_mask=allowed, dropout_p=dropout_p, scale=scale,
        )  # fmt: skip

    if dropout_p == 0:  # no RNG state to fork: keeps torch.compile's graph whole
        return attend().transpose(1, 2).flatten(0, 1)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return attend().transpose(1, 2).flatten(0, 1)


class _BandedAttention(AutogradFunction):
    """Chunked forward that stores only ``q, k, v``; the backward recomputes
    each chunk and accumulates its gradients in place (no full-size temporaries)."""

    @staticmethod
    def forward(ctx, q, k, v, blocking: _Blocking, scale: float, dropout_p: float):
        seeds = torch.randint(2**62, (len(blocking.chunks),)).tolist() if dropout_p > 0 else None
        out = v.new_empty(v.shape)
        for i, chunk in enumerate(blocking.chunks):
            qpos, kpos, allowed, rows = blocking.positions(chunk)
            seed = seeds[i] if seeds else 0
            attended = _attend(q[qpos], k[kpos], v[kpos], allowed, scale, dropout_p, seed)
            out[rows] = attended[: rows.stop - rows.start]
        ctx.save_for_backward(q, k, v)
        ctx.blocking, ctx.scale, ctx.dropout_p, ctx.seeds = blocking, scale, dropout_p, seeds
        return out

    @staticmethod
    @differentiable_once
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        grads = [torch.zeros_like(t) for t in (q, k, v)]
        for i, chunk in enumerate(ctx.blocking.chunks):
            qpos, kpos, allowed, rows = ctx.blocking.positions(chunk)
            grad_rows = grad_out.new_zeros(qpos.numel(), *grad_out.shape[1:])
            grad_rows[: rows.stop - rows.start] = grad_out[rows]  # repeated rows get 0
            with torch.enable_grad():
                inputs = [
                    t[pos].detach().requires_grad_()
                    for t, pos in zip((q, k, v), (qpos, kpos, kpos), strict=True)
                ]
                seed = ctx.seeds[i] if ctx.seeds else 0
                attended = _attend(*inputs, allowed, ctx.scale, ctx.dropout_p, seed)
                chunk_grads = torch.autograd.grad(attended, inputs, grad_rows)
            for grad, pos, chunk_grad in zip(grads, (qpos, kpos, kpos), chunk_grads, strict=True):
                grad.index_add_(0, pos.flatten(), chunk_grad.flatten(0, 1))
        return *grads, None, None, None


def banded_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    before: int,
    after: int,
    lengths: Sequence[int] | None = None,
    dilation: int = 1,
    scale: float | None = None,
    dropout_p: float = 0.0,
    block_size: int | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    r"""Softmax attention restricted to a band, as blocked dense kernels.

    Args:
        q: ``[N, H, C]`` queries.
        k: ``[N, H, C]`` keys.
        v: ``[N, H, C_v]`` values.
        before: keys to the left (in steps of ``dilation``) each query sees.
        after: keys to the right (in steps of ``dilation``) each query sees.
        lengths: lengths of the contiguous segments (default: one segment of
            length ``N``); no query attends across a segment boundary.
        dilation: stride :math:`s` between attended keys.
        scale: :math:`\lambda` (default :math:`1/\sqrt{C}`).
        dropout_p: dropout probability on the attention weights (pass ``0`` in
            evaluation mode).
        block_size: queries per block (default ``min(128, max(32, (before +
            after) // 2))``: a block of half the band's width computes at most
            about 1.5 times the band's work, in matrix products still large
            enough to run near BLAS speed).
        chunk_size: queries per chunk (recomputed in the backward pass); bounds
            the extra memory to
            :math:`O(\text{chunk\_size}\,(B + b + a)\,H\,C)`. Default: 512 on the
            CPU (gathered windows that stay in cache), 16,384 on an accelerator, where
            each chunk costs dozens of kernel launches and small chunks leave the device
            idle (with 4 heads of 64 channels and ``before = after = 64``, such a
            chunk's gathered keys and values take about 100 MB in float32).

    Returns:
        ``[N, H, C_v]``. Every query attends at least itself, so no row is empty.
        Inputs are expected finite: a block's window may reach past a query's band (into
        the next segment too), and a masked weight is ``0``, so a NaN or infinite key or
        value there still reaches the query (:math:`0 \cdot \mathrm{NaN}`); the edge
        list path (:class:`~hiergraph.nn.MaskedAttentionConv` with ``structured=False``)
        keeps it out.

    The result is differentiable in ``q``, ``k`` and ``v`` (first order).
    """
    lengths = _check_band(q, k, v, lengths, before, after, dilation)
    before, after, dilation = clamped_band(lengths, before, after, dilation)
    check_int(block_size, "block_size", optional=True)
    check_int(chunk_size, "chunk_size", optional=True)
    check_probability(dropout_p, "dropout_p")  # (a string: a TypeError on <=)
    n = q.size(0)
    if n == 0:
        return v.new_zeros(v.shape)
    if dilation > 1:
        order, class_lengths = _undilate(lengths, dilation, q.device)
        out = banded_attention(
            q[order],
            k[order],
            v[order],
            before,
            after,
            class_lengths,
            scale=scale,
            dropout_p=dropout_p,
            block_size=block_size,
            chunk_size=chunk_size,
        )
        return out[torch.argsort(order)]

    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    if chunk_size is None:
        chunk_size = 512 if q.device.type == "cpu" else 16384
    blocking = _Blocking(lengths, n, before, after, block_size, chunk_size, q.device)
    return _BandedAttention.apply(q, k, v, blocking, scale, dropout_p)


def banded_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    before: int,
    after: int,
    lengths: Sequence[int] | None = None,
    dilation: int = 1,
    scale: float | None = None,
) -> Tensor:
    r"""Dense :math:`O(N^2)` oracle for :func:`banded_attention` (same arguments
    and shapes, no dropout): an explicit ``[H, N, N]`` masked softmax.

    Args:
        q: ``[N, H, C]`` queries.
        k: ``[N, H, C]`` keys.
        v: ``[N, H, C_v]`` values.
        before: keys to the left (in steps of ``dilation``) each query sees.
        after: keys to the right (in steps of ``dilation``) each query sees.
        lengths: lengths of the contiguous segments (default: one segment of
            length ``N``); no query attends across a segment boundary.
        dilation: stride :math:`s` between attended keys.
        scale: :math:`\lambda` (default :math:`1/\sqrt{C}`).

    Returns:
        ``[N, H, C_v]``. Every query attends at least itself, so no row is empty.
    """
    lengths = _check_band(q, k, v, lengths, before, after, dilation)
    n = q.size(0)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    pos = torch.arange(n, device=q.device)
    allowed = band_predicate(
        pos[:, None], pos[None, :], segment_ids(lengths, q.device), before, after, dilation
    )
    scores = torch.einsum("ihc,jhc->hij", q, k) * scale
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    return torch.einsum("hij,jhc->ihc", weights, v)
