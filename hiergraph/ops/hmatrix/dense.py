r"""The dense reference of H-matrix attention: the implied logits :math:`\hat S` and
attention matrix :math:`\operatorname{softmax}(\hat S)`, built from the closed form of the
level map (:mod:`hiergraph.ops.hmatrix`) and the coarsening written level by level from
its definitions, independently of the packed fast path. Memory :math:`O(M L'^2)`: for
tests and small ``L``, or a sample of query rows.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from hiergraph._checks import check_bool, check_ids, described
from hiergraph.data.windows import HMatrixLayout, check_block_size, hmatrix_layout
from hiergraph.ops.hmatrix.inputs import check_inputs
from hiergraph.ops.logspace import softmax_dropping


def hmatrix_level_masks(
    length: int, block_size: int, causal: bool = False, rows: Tensor | None = None
) -> Tensor:
    r"""Boolean ``[M, L', L']`` masks; mask ``l`` marks the pairs :math:`(i, j)` with level ``l``.

    Built densely from the closed form of the level assignment (module
    docstring), independently of the blocked fast path. The masks are
    disjoint and cover every pair (causal: every pair :math:`j \le i`).

    Args:
        length: the sequence length :math:`L`, padded to :math:`L' = N_r 2^M`.
        block_size: :math:`N_r`, an even int ``>= 2``; clamped to ``ceil(L / 2)`` when
            ``L <= 2 * block_size`` (one level, :math:`M = 1`), as in
            :func:`~hiergraph.ops.hmatrix_attention`.
        causal: keep only the pairs :math:`j \le i`.
        rows: optional 1-D int64 (or int32) tensor of query indices in ``[0, L')``: only
            those rows, ``[M, len(rows), L']``. ``None`` for all :math:`L'` rows.

    Returns:
        Boolean ``[M, L', L']`` (or ``[M, len(rows), L']``) masks, on the CPU.
    """
    check_block_size(block_size)
    check_bool(causal, "causal")
    nr, num_levels, padded = hmatrix_layout(length, block_size)
    if rows is not None:
        _check_rows(rows, padded, "the padded length L'")
    i = (torch.arange(padded, device="cpu") if rows is None else rows.cpu()).unsqueeze(1)
    j = torch.arange(padded, device="cpu").unsqueeze(0)  # (whatever the default device)
    near = (i // nr - j // nr).abs() <= 1
    masks = [near & (j <= i) if causal else near]
    half = nr // 2
    for level in range(1, num_levels):
        ci, cj = i >> level, j >> level
        bi, bj, r, c = ci // nr, cj // nr, ci % nr, cj % nr
        left = (bj == bi - 1) & ~((r < half) & (c >= half))
        right = (bj == bi + 1) & ~((r >= half) & (c < half))
        masks.append(left if causal else left | right)
    return torch.stack(masks)


def hmatrix_logits(
    q: Tensor,
    k: Tensor,
    block_size: int,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    rows: Tensor | None = None,
) -> Tensor:
    r"""The implied logit matrix :math:`\hat S` as a dense ``[B, H, L, L]`` tensor.

    Excluded pairs (other level, causally masked, padded key) are
    :math:`-\infty`. Memory :math:`O(M L'^2)`: for tests and small ``L`` only,
    or pass ``rows`` for the rows of any ``L`` (memory :math:`O(M L' \cdot`
    ``len(rows)``:math:`)`).

    Args:
        q, k: ``[B, H, L, d]`` queries and keys (scaled by :math:`1/\sqrt d` here).
        block_size: :math:`N_r`, as in :func:`~hiergraph.ops.hmatrix_attention`.
        causal: query :math:`i` attends keys :math:`j \le i` only; coarse queries are the
            first token of their group.
        key_padding_mask: optional bool ``[B, L]``, ``True`` marks padding. Padded keys
            get :math:`-\infty` and coarse means skip them; padded positions are read as
            zeros.
        rows: optional 1-D int64 (or int32) tensor of query indices in ``[0, L)``: only
            those rows are formed. ``None`` for all :math:`L` rows.

    Returns:
        ``[B, H, L, L]`` logits (``[B, H, len(rows), L]`` with ``rows``).
    """
    check_inputs(q, k, q[..., :0], block_size, causal, key_padding_mask)
    if rows is not None:
        _check_rows(rows, q.shape[2], "the sequence length L")
    q, k = _without_padding(q, key_padding_mask), _without_padding(k, key_padding_mask)
    length = q.shape[2]
    if length == 0:  # no token has a layout (and ``rows``, checked, are none)
        return q @ k.transpose(-1, -2)  # the empty [B, H, 0, 0], in the inputs' graph
    layout = hmatrix_layout(length, block_size)
    qs, ks, counts = _coarsen(q, k, layout, causal, key_padding_mask)
    scale = q.shape[-1] ** -0.5
    rows = torch.arange(length, device=q.device) if rows is None else rows.to(q.device)
    masks = hmatrix_level_masks(length, block_size, causal, rows).to(q.device)
    logits = q.new_full((*q.shape[:2], len(rows), layout.padded_length), -math.inf)
    for level, (q_l, k_l) in enumerate(zip(qs, ks, strict=True)):
        coarse = q_l.index_select(2, rows >> level) @ k_l.transpose(-1, -2) * scale
        logits = torch.where(masks[level], coarse.repeat_interleave(2**level, -1), logits)
    key_ok = counts[0].transpose(-1, -2) > 0  # [B|1, 1, 1, L'] valid fine keys
    logits = logits.masked_fill(~key_ok, -math.inf)
    return logits[..., :length]


def hmatrix_attention_matrix(
    q: Tensor,
    k: Tensor,
    block_size: int,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    rows: Tensor | None = None,
) -> Tensor:
    r"""The implied attention matrix :math:`\operatorname{softmax}(\hat S)`, dense ``[B, H, L, L]``.

    Row-stochastic on valid rows; rows of padded queries (and rows with no
    valid key) are zero, as in :func:`~hiergraph.ops.hmatrix_attention`.

    Args:
        q, k: ``[B, H, L, d]`` queries and keys (scaled by :math:`1/\sqrt d` here).
        block_size: :math:`N_r`, as in :func:`~hiergraph.ops.hmatrix_attention`.
        causal: query :math:`i` attends keys :math:`j \le i` only.
        key_padding_mask: optional bool ``[B, L]``, ``True`` marks padding: padded keys get
            no weight and padded query rows are zero.
        rows: optional 1-D int64 (or int32) tensor of query indices in ``[0, L)``, as in
            :func:`hmatrix_logits`.

    Returns:
        ``[B, H, L, L]`` attention weights (``[B, H, len(rows), L]`` with ``rows``).
    """
    logits = hmatrix_logits(q, k, block_size, causal, key_padding_mask, rows)
    # excluded pairs are -inf, left out; a row without keys weighs 0
    _, attn = softmax_dropping(logits, logits == -math.inf)
    if key_padding_mask is not None:
        padded_rows = key_padding_mask if rows is None else key_padding_mask[:, rows]
        attn = attn.masked_fill(padded_rows[:, None, :, None], 0.0)
    return attn


def hmatrix_attention_dense(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    block_size: int,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    rows: Tensor | None = None,
) -> Tensor:
    r"""Dense reference for :func:`~hiergraph.ops.hmatrix_attention`:
    ``hmatrix_attention_matrix(q, k) @ v``.

    Args:
        q, k: ``[B, H, L, d]`` queries and keys (scaled by :math:`1/\sqrt d` here).
        v: ``[B, H, L, d_v]`` values; padded positions are read as zeros.
        block_size: :math:`N_r`, as in :func:`~hiergraph.ops.hmatrix_attention`.
        causal: query :math:`i` attends keys :math:`j \le i` only.
        key_padding_mask: optional bool ``[B, L]``, ``True`` marks padding, as in
            :func:`hmatrix_attention_matrix`.
        rows: optional 1-D int64 (or int32) tensor of query indices in ``[0, L)``: only
            those output rows are formed.

    Returns:
        ``[B, H, L, d_v]`` (``[B, H, len(rows), d_v]`` with ``rows``).
    """
    check_inputs(q, k, v, block_size, causal, key_padding_mask)
    attn = hmatrix_attention_matrix(q, k, block_size, causal, key_padding_mask, rows)
    return attn @ _without_padding(v, key_padding_mask)


def _check_rows(rows, count: int, what: str) -> None:
    """Raise unless ``rows`` is a 1-D integer tensor of query indices in ``[0, count)``
    (``what`` names ``count``): a row past the sequence read a padded position's logits, and
    a negative one failed inside an index lookup."""
    if not isinstance(rows, Tensor) or rows.dtype not in (torch.int64, torch.int32):
        raise TypeError(
            f"rows must be an int64 or int32 tensor of query indices, got {described(rows)}"
        )
    if rows.dim() != 1:
        raise ValueError(f"rows must be 1-D (one index per query row), got {described(rows)}")
    check_ids(rows, count, "query row", what)


def _without_padding(x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
    """``x`` ``[B, H, L, ·]`` with zeros at the padded positions: what they hold (NaN, inf)
    reaches no valid row, as in the fast path (a zero weight times NaN is NaN)."""
    if key_padding_mask is None:
        return x
    return x.masked_fill(key_padding_mask[:, None, :, None], 0.0)


def _coarsen(
    q: Tensor, k: Tensor, layout: HMatrixLayout, causal: bool, key_padding_mask: Tensor | None
) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    r"""Reference coarsening: per-level q, k ``[B, H, L'/2^l, d]``, counts ``[B|1, 1, L'/2^l, 1]``.

    Written level by level from the definitions (sums of valid tokens over
    their counts), independently of the packed fast path (:mod:`~hiergraph.ops.hmatrix.packed`).
    """
    length = q.shape[2]
    valid = q.new_ones(1, 1, length, 1)
    if key_padding_mask is not None:
        valid = (~key_padding_mask).to(q.dtype)[:, None, :, None]
        q, k = q * valid, k * valid
    pad = layout.padded_length - length
    q, k, valid = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, valid))
    qs, ks, counts = [q], [k], [valid]
    q_sum, k_sum = q, k
    for _ in range(1, layout.num_levels):
        counts.append(_pairsum(counts[-1]))
        inverse = 1.0 / counts[-1].clamp_min(1.0)
        k_sum = _pairsum(k_sum)
        ks.append(k_sum * inverse)
        if causal:
            qs.append(qs[-1][:, :, ::2])
        else:
            q_sum = _pairsum(q_sum)
            qs.append(q_sum * inverse)
    return qs, ks, counts


def _pairsum(x: Tensor) -> Tensor:
    """Restriction: ``[B, H, 2m, c]`` → ``[B, H, m, c]``, sums of adjacent rows."""
    return x.unflatten(2, (-1, 2)).sum(3)
