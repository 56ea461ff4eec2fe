r"""VIP-token-centric compression (VCC) of one transformer layer, batched and flat.

Zeng et al., *VCC: Scaling Transformers to 128K Tokens or More by Prioritizing
Important Tokens* (Sec. 3). With the VIP tokens :math:`P` moved to the front,
:math:`X = [P; C]`, one layer :math:`X \mapsto X + \gamma(X)` is replaced by

.. math::
    X_{\text{new}} = S^\dagger \gamma(S X) + X, \qquad
    S = \begin{bmatrix} I & 0 \\ 0 & S_c \end{bmatrix}, \qquad
    S^\dagger = \begin{bmatrix} I & 0 \\ 0 & S_c^\top D \end{bmatrix}

(eq. 7/9, Claim 6.3), where the rows of :math:`S_c` average the segments of a
partition :math:`\mathcal{J}` of :math:`C` chosen by the VIP tokens
(:func:`~hiergraph.ops.vcc.segment_tree.select_segments`), and
:math:`D = \mathrm{diag}(s_1, \dots, s_{|\mathcal{J}|})` holds the segment sizes.
Inside :math:`\gamma`, :math:`D` enters every softmax as a key bias
:math:`\log s_j` (a mean row counts as :math:`s_j` identical keys). :math:`S X`
is a segment mean and :math:`S^\dagger Y` a pure gather; in the tree form
(:func:`vcc_layer`) neither is formed: rows come from the tree and the new rows
go back into it (Algorithm 2).

Shapes: ``B`` sequences, ``d`` features; flat VIP rows ``p`` ``[N_p, d]`` with
pointer ``p_ptr`` ``[B + 1]``; the non-VIP tokens live in a
:class:`~hiergraph.ops.vcc.segment_tree.SegmentTree`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch_geometric.utils import segment, to_dense_batch

from hiergraph._checks import described, holds_integers, refuse_where
from hiergraph._precision import accumulation_dtype, widened
from hiergraph._runs import run_ptr
from hiergraph.ops.vcc.segment_tree import (
    ScoreFn,
    SegmentTree,
    Selection,
    TreeState,
    select_segments,
    take_rows,
    update_tree,
)

LayerFn = Callable[[Tensor, Tensor], Tensor]
"""``layer_fn(z [B, r, d], key_bias [B, r]) -> z + gamma(z)``; ``key_bias`` is added to
every attention logit of key ``j`` (``log s_j``, ``-inf`` for padding)."""


def _batch(ptr: Tensor) -> Tensor:
    sizes = ptr.diff()
    return torch.arange(sizes.numel(), device=ptr.device).repeat_interleave(sizes)


def vip_partition(
    x: Tensor, vip_mask: Tensor, token_mask: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""The stable permutation :math:`X \mapsto [P; C]` of eq. (6), flattened over the batch.

    VIP rows keep their relative order, and so do the other rows (a stable
    permutation, so that the segments of the multi-resolution compression of
    Sec. 3.3 stay contiguous); padded rows are dropped. Inverse: :func:`vip_restore`.

    Args:
        x (torch.Tensor): ``[B, n, d]``.
        vip_mask (torch.Tensor): ``[B, n]`` bool, ``True`` = VIP token.
        token_mask (torch.Tensor, optional): ``[B, n]`` bool, ``True`` = real
            (valid) token, ``False`` = padding. (default: :obj:`None`, all real)

    Returns:
        ``(p [N_p, d], p_ptr [B + 1], c [N_c, d], c_ptr [B + 1])``.
    """
    vip_mask, token_mask = check_vip_inputs(x, vip_mask, token_mask)
    other = token_mask & ~vip_mask
    flat = x.reshape(-1, x.size(-1))
    p = take_rows(flat, vip_mask.flatten().nonzero().squeeze(1))
    c = take_rows(flat, other.flatten().nonzero().squeeze(1))
    return p, run_ptr(vip_mask.sum(1)), c, run_ptr(other.sum(1))


def vip_restore(p: Tensor, c: Tensor, vip_mask: Tensor, token_mask: Tensor | None = None) -> Tensor:
    """Inverse of :func:`vip_partition`: ``[B, n, d]`` with zeros at padded positions
    (``token_mask`` ``[B, n]`` bool, ``True`` = real token; default: all real)."""
    if token_mask is None:
        token_mask = torch.ones_like(vip_mask)
    index = torch.cat([vip_mask.flatten().nonzero(), (token_mask & ~vip_mask).flatten().nonzero()])
    out = p.new_zeros(vip_mask.numel(), p.size(-1)).index_copy(
        0, index.squeeze(1), torch.cat([p, c])
    )
    return out.view(*vip_mask.shape, p.size(-1))


def vip_attention_scores(
    q: Tensor, q_ptr: Tensor, k: Tensor, k_batch: Tensor, log_count: Tensor
) -> Tensor:
    r"""Selection score of each candidate segment: its attention probability from the
    VIP tokens of its sequence, averaged over VIP tokens and heads.

    .. math::
        \mu_x = \frac{1}{H n_p}\sum_{h,i}
                \operatorname{softmax}_{x' \in \text{cand}}
                \big(q_{ih}^\top k_{x'h} + \log s_{x'}\big)_x

    This is eq. (53) with the layer's own projections and per-VIP
    normalisation (as in the authors' code, ``github.com/mlpen/VCC``), plus the
    multiplicity :math:`\log s` so that a short last segment weighs what it
    holds. Sequences without VIP tokens score 0 everywhere.

    Args:
        q: ``[N_p, H, d_h]`` VIP queries (already scaled), pointer ``q_ptr`` ``[B + 1]``.
        k: ``[M, H, d_h]`` keys of the candidate segment means, ``k_batch`` ``[M]`` (sorted).
        log_count: ``[M]`` :math:`\log s` of each candidate.
    """
    num_seq = q_ptr.numel() - 1
    qd, qmask = to_dense_batch(q, _batch(q_ptr), batch_size=num_seq)  # [B, P, H, d_h]
    kd, kmask = to_dense_batch(k, k_batch, batch_size=num_seq)  # [B, M, H, d_h]
    key_bias = torch.full(kmask.shape, float("-inf"), dtype=k.dtype, device=k.device)
    key_bias[kmask] = log_count.to(k.dtype)
    return vip_scores_padded(qd, qmask, kd, key_bias)[kmask]


def vip_scores_padded(q: Tensor, slot_real: Tensor, k: Tensor, key_bias: Tensor) -> Tensor:
    r""":func:`vip_attention_scores` on padded tensors (both forms' scores): each candidate's
    attention probability from the real VIP slots, averaged over slots and heads,

    .. math::
        \mu_x = \frac{1}{H n_p}\sum_{h,i}
                \operatorname{softmax}_{x'}\big(q_{ih}^\top k_{x'h} + \log s_{x'}\big)_x .

    Args:
        q: ``[B, S, H, d_h]`` VIP queries (already scaled), ``slot_real`` ``[B, S]`` bool.
        k: ``[B, c, H, d_h]`` keys of the candidates' means, ``key_bias`` ``[B, c]``
            (:math:`\log s`, ``-inf`` for candidates without tokens).

    Returns:
        ``[B, c]``; 0 in sequences without VIP tokens. Taken in float32 for half-precision
        inputs: rounded to bf16, probabilities that differ by less than about 1/256 of their
        value tie, and a tie goes to the earlier segment.
    """
    q, k, key_bias = widened(q, k, key_bias)
    logits = torch.einsum("bihd,bxhd->bhix", q, k) + key_bias[:, None, None, :]
    prob = torch.softmax(logits, -1).nan_to_num(0.0)  # a sequence without candidates
    prob = (prob * slot_real[:, None, :, None]).sum((1, 2))
    num_vip = (slot_real.sum(1) * q.size(2)).clamp(min=1).to(prob.dtype)
    return prob / num_vip[:, None]


def vip_score_fn(q: Tensor, q_ptr: Tensor, key_fn: Callable[[Tensor], Tensor]) -> ScoreFn:
    """A :data:`~hiergraph.ops.vcc.segment_tree.ScoreFn` for :func:`select_segments` from VIP
    queries ``q`` ``[N_p, H, d_h]`` and a map ``key_fn`` from means ``[M, d]`` to keys
    ``[M, H, d_h]`` (see :func:`vip_attention_scores`)."""

    def score(mean: Tensor, batch: Tensor, count: Tensor) -> Tensor:
        return vip_attention_scores(q, q_ptr, key_fn(mean), batch, log_count(count, mean.dtype))

    return score


def log_count(count: Tensor, dtype: torch.dtype) -> Tensor:
    r""":math:`\log s` of the segment sizes ``count`` as ``dtype``: the log is taken in
    float32 (float64 for float64) and only the result is cast, so sizes past the fp16
    range (65504) or bf16's 8-bit mantissa stay exact."""
    return count.to(accumulation_dtype(dtype)).log().to(dtype)


def compress(c: Tensor, sel: Selection) -> Tensor:
    r""":math:`S_c C` from the tokens ``c`` ``[N, d]``: one segment mean per row of
    :math:`\mathcal{J}`, ``[R, d]``, in ``c``'s dtype. bf16/fp16 tokens are averaged in
    float32 and the means rounded once (a half-precision running sum stalls).

    Args:
        c: ``[N, d]`` token rows in flat token order, ``N = sel.num_tokens``.
        sel: the partition :math:`\mathcal{J}`, a
            :class:`~hiergraph.ops.vcc.segment_tree.Selection` (from
            :func:`~hiergraph.ops.select_segments`).

    Raises:
        ValueError: unless ``c`` is ``[N, d]`` for the ``N`` tokens ``sel`` partitions (the
            segment reduction reads ``N`` rows whatever ``c``'s size).
    """
    if not isinstance(c, Tensor) or c.dim() != 2 or c.size(0) != sel.num_tokens:
        raise ValueError(
            f"c must be the [{sel.num_tokens}, d] tokens the selection partitions, got "
            f"{described(c)}"
        )
    return segment(c.to(accumulation_dtype(c.dtype)), sel.token_ptr, reduce="mean").to(c.dtype)


def decompress(rows: Tensor, sel: Selection) -> Tensor:
    r""":math:`S_c^\dagger Y = S_c^\top D\, Y` for ``rows`` ``[R, d]``: every token copies its
    segment's row (a gather), ``[N, d]``.

    Args:
        rows: ``[R, d]``, one row per segment of ``sel``, in its row order.
        sel: the partition :math:`\mathcal{J}`, a
            :class:`~hiergraph.ops.vcc.segment_tree.Selection` (from
            :func:`~hiergraph.ops.select_segments`).

    Raises:
        ValueError: unless ``rows`` is ``[R, d]`` for the ``R`` segments of ``sel``.
    """
    if not isinstance(rows, Tensor) or rows.dim() != 2 or rows.size(0) != sel.count.numel():
        raise ValueError(
            f"rows must be [{sel.count.numel()}, d], one per segment of the selection, got "
            f"{described(rows)}"
        )
    return rows[sel.token_to_row]


def pack_compressed(
    p: Tensor, p_ptr: Tensor, rows: Tensor, sel: Selection
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""Stack :math:`[P; S_c C]` of every sequence into a padded batch.

    Returns:
        ``z`` ``[B, r_max, d]``; ``key_bias`` ``[B, r_max]`` (0 for VIP rows,
        :math:`\log s` for segment rows, taken in float32 then cast to ``rows``'
        dtype (:func:`log_count`), ``-inf`` for padding); ``real``
        ``[B, r_max]`` bool; ``order`` ``[N_p + R]`` (the flat row order, for
        :func:`unpack_compressed`).
    """
    num_seq = p_ptr.numel() - 1
    batch = torch.cat([_batch(p_ptr), sel.batch])
    order = torch.sort(batch, stable=True).indices  # VIP rows first within each sequence
    log_s = torch.cat([p.new_zeros(p.size(0)), log_count(sel.count, rows.dtype)])
    if num_seq == 0:  # (PyG's to_dense_batch takes no empty batch)
        z = torch.cat([p, rows]).new_zeros(0, 0, p.size(-1))
        real = torch.zeros(0, 0, dtype=torch.bool, device=z.device)
    else:
        z, real = to_dense_batch(torch.cat([p, rows])[order], batch[order], batch_size=num_seq)
    key_bias = torch.full(real.shape, float("-inf"), dtype=z.dtype, device=z.device)
    key_bias[real] = log_s[order]
    return z, key_bias, real, order


def unpack_compressed(
    out: Tensor, real: Tensor, order: Tensor, num_vip: int
) -> tuple[Tensor, Tensor]:
    """Inverse of :func:`pack_compressed`: ``(p [N_p, d], rows [R, d])`` from
    ``out [B, r_max, d]``."""
    flat = out[real]
    flat = flat.new_empty(flat.shape).index_copy(0, order, flat)
    return flat[:num_vip], flat[num_vip:]


def vcc_layer(
    layer_fn: LayerFn,
    p: Tensor,
    p_ptr: Tensor,
    state: TreeState,
    tree: SegmentTree,
    budgets: Sequence[int | None],
    score_fn: ScoreFn | None = None,
) -> tuple[Tensor, TreeState, Selection]:
    r"""One VCC layer on the tree (Algorithm 2 with Algorithm 1's selection).

    1. :math:`\mathcal{J}` and :math:`S_c C` from the tree by VIP priority.
    2. ``layer_fn`` on :math:`[P; S_c C]` with the :math:`\log s` key bias
       (eq. 54): :math:`[P_{\text{new}}; S_c C_{\text{new}}] = [P; S_c C] + \gamma([P; S_c C])`.
    3. The new rows go back into the tree (Claim 6.5); no ``n``-length tensor is formed
       besides the out-of-place copy of the token deviations.

    Args:
        layer_fn: ``(z [B, r_max, d], key_bias [B, r_max]) -> z + gamma(z)``, of ``z``'s
            shape; ``key_bias`` is 0 for VIP rows, :math:`\log s` for segment rows and
            ``-inf`` for padding (:data:`~hiergraph.ops.vcc.layer.LayerFn`).
        p: ``[N_p, d]`` VIP rows of all sequences, flat, with the tree state's ``d``.
        p_ptr: ``[B + 1]`` integer pointer into ``p``, non-decreasing from 0 to ``N_p``,
            for the tree's ``B`` sequences.
        state: the stored non-VIP tokens, a
            :class:`~hiergraph.ops.vcc.segment_tree.TreeState`.
        tree: their :class:`~hiergraph.ops.SegmentTree`.
        budgets: per-level refinement budgets, root first, as in
            :func:`~hiergraph.ops.select_segments`.
        score_fn: ``(means [M, d], batch [M], count [M]) -> [M]``, as in
            :func:`~hiergraph.ops.select_segments`; required unless every budget is
            ``None`` or ``0``.

    Returns:
        ``(p_new [N_p, d], state_new, selection)``.
    """
    _check_vip_rows(p, p_ptr, tree.num_sequences, state.root)
    sel = select_segments(state, tree, budgets, score_fn)
    z, key_bias, real, order = pack_compressed(p, p_ptr, sel.value, sel)
    out = layer_fn(z, key_bias)
    check_layer_output(out, z)
    p_new, rows_new = unpack_compressed(out, real, order, p.size(0))
    return p_new, update_tree(state, tree, sel, rows_new), sel


def _check_vip_rows(p: Tensor, p_ptr: Tensor, num_sequences: int, root: Tensor) -> None:
    """Raise unless ``p`` ``[N_p, d]`` holds the rows ``p_ptr`` ``[B + 1]`` (integers) points
    into, for the tree's ``B`` sequences, with the features of the tree's rows (``root``,
    :class:`TreeState`); a device-side assertion on an accelerator. Dtypes may differ (they
    promote, and under autocast a layer returns half-precision rows)."""
    if not isinstance(p, Tensor) or p.dim() != 2:
        raise ValueError(f"p must be a [N_p, d] tensor, got {described(p)}")
    if p.size(1) != root.size(1):  # (a size error in a concatenation)
        raise ValueError(f"p must have the tree state's {root.size(1)} features, got {p.size(1)}")
    if not isinstance(p_ptr, Tensor) or p_ptr.shape != (num_sequences + 1,):
        raise ValueError(
            f"p_ptr must be [{num_sequences + 1}] (the tree's {num_sequences} sequences, "
            f"+ 1), got {described(p_ptr)}"
        )
    if not holds_integers(p_ptr):
        raise TypeError(f"p_ptr must be an integer tensor, got {described(p_ptr)}")
    bad = (p_ptr[0] != 0) | (p_ptr[-1] != p.size(0)) | (p_ptr.diff() < 0).any()
    message = f"p_ptr must run from 0 to p's {p.size(0)} rows, non-decreasing"
    refuse_where(bad, message, found=p_ptr.tolist)


def check_layer_output(out: Tensor, z: Tensor) -> None:
    """Raise unless ``layer_fn`` kept the shape of its input ``z``."""
    if not isinstance(out, Tensor) or out.shape != z.shape:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"layer_fn must return its input's shape {tuple(z.shape)}, got {got}")


def check_vip_inputs(
    x: Tensor, vip_mask: Tensor, token_mask: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Validate ``x [B, n, d]``, ``vip_mask`` and ``token_mask`` (``[B, n]`` bool,
    ``True`` = VIP / real token); returns the two masks (``token_mask`` all ``True``
    when ``None``)."""
    if not isinstance(x, Tensor) or x.dim() != 3:
        raise ValueError(f"x must be a [B, n, d] tensor, got shape {getattr(x, 'shape', None)}")
    if token_mask is None:
        token_mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
    for name, m in (("vip_mask", vip_mask), ("token_mask", token_mask)):
        if not isinstance(m, Tensor) or m.dtype != torch.bool:
            raise TypeError(f"{name} must be a bool tensor [B, n]; convert with .bool()")
        if m.shape != x.shape[:2]:
            raise ValueError(
                f"{name} must have shape {tuple(x.shape[:2])} (x's [B, n]), got {tuple(m.shape)}"
            )
        if m.device != x.device:
            raise ValueError(f"{name} is on {m.device} but x is on {x.device}")
    refuse_where(
        (vip_mask & ~token_mask).any(),
        "vip_mask marks padded positions (token_mask False) as VIP; use vip_mask & token_mask",
    )
    return vip_mask, token_mask
