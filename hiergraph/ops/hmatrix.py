r"""H-matrix attention (H-Transformer-1D) in linear time and memory.

Zhu & Soricut, *H-Transformer-1D: Fast One-Dimensional Hierarchical Attention
for Sequences* (ACL 2021); notes/h_transformer_1d.md. The block layout is the
paper's tri-diagonal + overlap-correction construction (§5.2.3, "variant B" of
the note), which is also the one of the authors' released code.

Coarsening levels
-----------------
With :math:`N_r` the block size ("numerical rank"), the sequence is padded to
:math:`L' = N_r 2^M` and coarsened :math:`M-1` times by pairs. At level
:math:`l` a coarse token :math:`I` stands for the fine tokens
:math:`\{i : \lfloor i/2^l \rfloor = I\}` and carries

.. math::
    \tilde q^{(l)}_I = \operatorname{mean}_{i \in I} q_i, \qquad
    \tilde k^{(l)}_J = \operatorname{mean}_{j \in J} k_j, \qquad
    \tilde v^{(l)}_J = \textstyle\sum_{j \in J} v_j, \qquad
    n^{(l)}_J = |J|

(means and counts over valid, i.e. non-padded, tokens; in causal mode
:math:`\tilde q^{(l)}_I = q_{I 2^l}`, the first token of the group, because a
mean would mix in future queries). Each level is cut into blocks of
:math:`N_r` coarse tokens, i.e. windows of :math:`N_r 2^l` fine tokens.

Implied attention matrix
------------------------
Every pair :math:`(i, j)` gets exactly one level :math:`l(i, j)`
(:func:`hmatrix_level_masks`) and the logit

.. math::
    \hat S_{ij} = \tilde q^{(l)}_{\lfloor i/2^l \rfloor}{}^\top
                  \tilde k^{(l)}_{\lfloor j/2^l \rfloor} / \sqrt d,
    \qquad l = l(i, j),

and the output is the row softmax :math:`Z = \operatorname{softmax}(\hat S) V`.
Level 0 is the block tri-diagonal: query block :math:`b` sees key blocks
:math:`b-1, b, b+1` exactly. At level :math:`l \ge 1` coarse query block
:math:`b` sees coarse key blocks :math:`b \pm 1`, minus the quarter that level
:math:`l-1` already covers (with :math:`h = N_r/2`, row :math:`r` and column
:math:`c` inside the block: drop :math:`r \ge h, c < h` on the right block and
:math:`r < h, c \ge h` on the left block). Causal mode keeps only keys
:math:`j \le i`: the lower triangle of the diagonal blocks and the left blocks.
Each far block of :math:`\hat S` is a piecewise-constant expansion of an
:math:`N_r \times N_r` coarse block, so it has rank :math:`\le N_r`.

:func:`hmatrix_attention` computes :math:`Z` without forming :math:`\hat S`:
per level, :math:`Y_l = \exp(\tilde S_l - \mu_l)\,\tilde V_l` and
:math:`R_l = \exp(\tilde S_l - \mu_l)\, n_l` on the coarse grid, then
coarse-to-fine :math:`\hat Y \leftarrow \mathrm{repeat}_2(\hat Y)\,
e^{\mathrm{repeat}_2(\mu_{l+1}) - \mu_l} + Y_l` (and the same for :math:`\hat R`),
and :math:`Z = \hat Y / \hat R`. The shift :math:`\mu_l` of a coarse row is the
running maximum of its logits over levels :math:`\ge l`, so every fine row is
shifted once, by its own maximum logit, across all levels: no overflow, no
underflow of a whole row, and :math:`\hat R \ge 1` for every row that has a key.
:func:`hmatrix_attention_dense` builds :math:`\operatorname{softmax}(\hat S)`
densely and is the reference the fast path is tested against.

The levels as a window hierarchy
--------------------------------
The coarse tokens of all levels are the nodes of a hopping-window hierarchy
over the (padded) sequence with branching factor 2 at every level: node
:math:`I` of level :math:`l` is the window :math:`[I 2^l, (I+1) 2^l)`, its
children are the two windows of level :math:`l-1` it is made of, and
:math:`\tilde q, \tilde k` are the mean leaf query/key below it while
:math:`\tilde v` is the leaf value sum (``hiergraph.data.window_hierarchy``
with ``branching=(2, 2, ...)`` builds this tree as a PyG graph). A level-:math:`l`
block is the run of :math:`N_r` consecutive nodes covering
:math:`N_r 2^l` tokens.

How H-matrix attention differs from HSA
---------------------------------------
Hierarchical Self-Attention (:func:`hiergraph.ops.hierarchical_attention`)
and H-matrix attention both use mean queries/keys of tree nodes for far
interactions, but they tie different blocks and normalise differently:

* **Tied blocks.** In HSA the tree is the model: for two sibling subtrees
  :math:`A, B`, every leaf of :math:`A` gives the *same* weight to every leaf
  of :math:`B`; the block :math:`A \times B` of the attention matrix is
  rank one, with logit :math:`\rho_q(A)^\top \rho_k(B)/\sqrt d + \log n(B)`.
  In H-matrix attention the tied blocks are :math:`2^l \times 2^l` tiles of
  an :math:`N_r 2^l`-wide off-diagonal block, so the block has rank
  :math:`\le N_r`, and the tiles shrink towards the diagonal (exact
  attention on the :math:`\ge N_r` nearest tokens on each side).
* **Normalisation.** HSA normalises per family: each node's softmax runs over
  its siblings, and per-node gates :math:`\mu` mix the levels along a root
  path, which makes the whole matrix the KL-optimal block-constrained
  projection of flat softmax attention. H-matrix attention has no gates: all
  levels' exponentials go into one row sum and the row is normalised once.
  It is a fixed low-rank approximation of the *logits*, not an optimal
  projection of the attention distribution.
* **Structure.** HSA runs on any signal hierarchy (``SignalHierarchy``);
  H-matrix attention assumes a 1-D sequence whose hierarchy is the implicit
  binary window tree above, so it needs no index tensors at all.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable


class HMatrixLayout(NamedTuple):
    """Shape of the hierarchy for a sequence of ``length`` tokens.

    Attributes:
        block_size: the effective :math:`N_r`. It equals the requested block
            size unless ``length <= 2 * block_size``, where it becomes
            ``ceil(length / 2)`` (one level: exact softmax attention).
        num_levels: :math:`M`, the number of levels ``0 .. M-1``.
        padded_length: :math:`L' = N_r 2^M \\ge` ``length``.
    """

    block_size: int
    num_levels: int
    padded_length: int


def hmatrix_layout(length: int, block_size: int) -> HMatrixLayout:
    """Padded length, number of levels and effective block size (see :class:`HMatrixLayout`)."""
    if length <= 2 * block_size:
        nr = -(-length // 2)
        return HMatrixLayout(nr, 1, 2 * nr)
    num_levels = math.ceil(math.log2(length / block_size))
    return HMatrixLayout(block_size, num_levels, block_size * 2**num_levels)


def hmatrix_level_masks(length: int, block_size: int, causal: bool = False) -> Tensor:
    r"""Boolean ``[M, L', L']`` masks; mask ``l`` marks the pairs :math:`(i, j)` with level ``l``.

    Built densely from the closed form of the level assignment (module
    docstring), independently of the blocked fast path. The masks are
    disjoint and cover every pair (causal: every pair :math:`j \le i`).
    """
    _check_block_size(block_size)
    nr, num_levels, padded = hmatrix_layout(length, block_size)
    i = torch.arange(padded).unsqueeze(1)
    j = torch.arange(padded).unsqueeze(0)
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


def hmatrix_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    block_size: int,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
) -> Tensor:
    r"""H-matrix attention :math:`Z = \operatorname{softmax}(\hat S)\,V` in :math:`O(L N_r)`.

    See the module docstring for :math:`\hat S`. The sequence is zero-padded
    internally to :math:`L' = N_r 2^M`; padded tokens are never attended.
    Outputs at valid positions do not depend on what padded positions hold,
    but they do depend on :math:`L'` (the hierarchy changes with it).

    Cost per (batch, head): :math:`3 N_r^2 (2L'/N_r + M - 3)` logits
    (:math:`\approx 6 L' N_r`), :math:`O(L' (N_r + d))` memory; no
    :math:`L \times L` tensor is formed. All levels are packed into one
    sequence and computed by one banded block matmul (each block against its
    left, own and right neighbour; at coarse levels the own-block third is
    masked, a 20% overhead over the minimal :math:`5 L' N_r` that buys a
    single BLAS-friendly kernel).

    Args:
        q, k: ``[B, H, L, d]`` queries and keys (scaled by :math:`1/\sqrt d` here).
        v: ``[B, H, L, d_v]`` values.
        block_size: :math:`N_r`, an even int ``>= 2``; the exact window is at
            least ``block_size`` tokens on each side and every far block is a
            ``block_size x block_size`` coarse block. Clamped to
            ``ceil(L / 2)`` when ``L <= 2 * block_size``, which gives exact
            softmax attention.
        causal: query :math:`i` attends keys :math:`j \le i` only; coarse
            queries are the first token of their group.
        key_padding_mask: optional bool ``[B, L]``, ``True`` marks padding
            (the :class:`torch.nn.MultiheadAttention` convention). Padded keys
            get no weight, coarse means skip them, and padded query rows
            return zeros; so does any row with no valid key.

    Returns:
        ``[B, H, L, d_v]``.
    """
    _check_inputs(q, k, v, block_size, key_padding_mask)
    length, d_v = q.shape[2], v.shape[-1]
    layout = hmatrix_layout(length, block_size)
    nr, num_levels = layout.block_size, layout.num_levels
    qs, ks, vs, counts = _coarsen(q, k, v, layout, causal, key_padding_mask)
    rows = [x.shape[2] for x in qs]

    # All levels in one packed sequence, separated by blocks of zero rows.
    q_pack, k_pack, v_pack = (_pack(xs, nr) for xs in (qs, ks, vs))
    logits = band_scores(q_pack, k_pack, nr)  # [B, H, P, nr, 3nr]
    logits.add_(_band_bias(counts, rows, nr, causal))  # in place: the band buffer is ours

    # One shift per fine row: the running max over levels >= l, top-down.
    row_max = _unpack(logits.detach().amax(-1).flatten(-2).unsqueeze(-1), rows, nr)
    shifts = [row_max[-1]]
    for level in range(num_levels - 2, -1, -1):
        shifts.insert(0, torch.maximum(row_max[level], _repeat2(shifts[0])))
    finite = [s.masked_fill(s == -math.inf, 0.0) for s in shifts]
    weights = logits.sub_(_pack(finite, nr).unflatten(-2, (-1, nr))).exp_()

    # Y_l and R_l for all levels at once (the last value column is the count n_l).
    sums = _unpack(band_apply(weights, v_pack, nr).flatten(-3, -2), rows, nr)
    acc = sums[-1]
    for level in range(num_levels - 2, -1, -1):
        acc = _repeat2(acc) * torch.exp(_repeat2(shifts[level + 1]) - finite[level]) + sums[level]
    acc = acc[:, :, :length]
    num, den = acc[..., :d_v], acc[..., d_v:]
    out = num / torch.where(den > 0, den, torch.ones_like(den))
    if key_padding_mask is not None:
        out = out.masked_fill(key_padding_mask[:, None, :, None], 0.0)
    return out


def hmatrix_logits(
    q: Tensor,
    k: Tensor,
    block_size: int,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
) -> Tensor:
    r"""The implied logit matrix :math:`\hat S` as a dense ``[B, H, L, L]`` tensor.

    Excluded pairs (other level, causally masked, padded key) are
    :math:`-\infty`. Memory :math:`O(M L'^2)`: for tests and small ``L`` only.
    """
    _check_inputs(q, k, q[..., :0], block_size, key_padding_mask)
    length = q.shape[2]
    layout = hmatrix_layout(length, block_size)
    qs, ks, _, counts = _coarsen(q, k, q[..., :0], layout, causal, key_padding_mask)
    masks = hmatrix_level_masks(length, block_size, causal).to(q.device)
    logits = q.new_full((*qs[0].shape[:3], layout.padded_length), -math.inf)
    for level, (q_l, k_l) in enumerate(zip(qs, ks, strict=True)):
        coarse = q_l @ k_l.transpose(-1, -2)
        fine = coarse.repeat_interleave(2**level, -2).repeat_interleave(2**level, -1)
        logits = torch.where(masks[level], fine, logits)
    key_ok = counts[0].transpose(-1, -2) > 0  # [B|1, 1, 1, L'] valid fine keys
    logits = logits.masked_fill(~key_ok, -math.inf)
    return logits[:, :, :length, :length]


def hmatrix_attention_matrix(
    q: Tensor,
    k: Tensor,
    block_size: int,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
) -> Tensor:
    r"""The implied attention matrix :math:`\operatorname{softmax}(\hat S)`, dense ``[B, H, L, L]``.

    Row-stochastic on valid rows; rows of padded queries (and rows with no
    valid key) are zero, as in :func:`hmatrix_attention`.
    """
    logits = hmatrix_logits(q, k, block_size, causal, key_padding_mask)
    shift = logits.amax(-1, keepdim=True)
    weights = torch.exp(logits - shift.masked_fill(shift == -math.inf, 0.0))
    total = weights.sum(-1, keepdim=True)
    attn = weights / torch.where(total > 0, total, torch.ones_like(total))
    if key_padding_mask is not None:
        attn = attn.masked_fill(key_padding_mask[:, None, :, None], 0.0)
    return attn


def hmatrix_attention_dense(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    block_size: int,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
) -> Tensor:
    """Dense reference for :func:`hmatrix_attention`: ``hmatrix_attention_matrix(q, k) @ v``."""
    _check_inputs(q, k, v, block_size, key_padding_mask)
    return hmatrix_attention_matrix(q, k, block_size, causal, key_padding_mask) @ v


# --------------------------------------------------------------------------- banded block matmul


def _band(x: Tensor, n: int) -> Tensor:
    """``[T*n, c]`` → ``[T-2, c, 3n]``: blocks ``t, t+1, t+2`` side by side, for ``t < T-2``.

    A strided view (overlapping windows of one buffer), not a copy.
    """
    return x.unfold(0, 3 * n, n)


def _inner_bmm(a: Tensor, b: Tensor) -> Tensor:
    """``a[1:-1] @ b`` written into blocks ``1 .. T-2`` of a ``[T, ·, ·]`` output with zero ends."""
    out = a.new_empty(a.shape[0], a.shape[1], b.shape[-1])
    out[0], out[-1] = 0.0, 0.0
    torch.bmm(a[1:-1], b, out=out[1:-1])
    return out


def _unband(g: Tensor, n: int) -> Tensor:
    """Adjoint of :func:`_band`: ``[T-2, 3n, c]`` → ``[T*n, c]`` (overlaps summed)."""
    out = g.new_empty(g.shape[0] + 2, n, g.shape[-1])
    out[0], out[-1] = 0.0, 0.0
    out[1:-1] = g[:, n : 2 * n]
    out[:-2] += g[:, :n]
    out[2:] += g[:, 2 * n :]
    return out.flatten(0, 1)


class _BandScores(torch.autograd.Function):
    """``S[t] = A[t] @ band(B)[t-1]`` (inner ``t``): ``[T, n, c] x [T*n, c] → [T, n, 3n]``."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, n: int) -> Tensor:
        ctx.save_for_backward(a, b)
        ctx.n = n
        return _inner_bmm(a, _band(b, n))

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        a, b = ctx.saved_tensors
        grad_a = _inner_bmm(grad, _band(b, ctx.n).transpose(1, 2))
        grad_b = _unband(grad[1:-1].transpose(1, 2) @ a[1:-1], ctx.n)
        return grad_a, grad_b, None


class _BandApply(torch.autograd.Function):
    """``Y[t] = E[t] @ band(B)[t-1]ᵀ`` (inner ``t``): ``[T, n, 3n] x [T*n, c] → [T, n, c]``."""

    @staticmethod
    def forward(ctx, e: Tensor, b: Tensor, n: int) -> Tensor:
        ctx.save_for_backward(e, b)
        ctx.n = n
        return _inner_bmm(e, _band(b, n).transpose(1, 2))

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        e, b = ctx.saved_tensors
        grad_e = _inner_bmm(grad, _band(b, ctx.n))
        grad_b = _unband(e[1:-1].transpose(1, 2) @ grad[1:-1], ctx.n)
        return grad_e, grad_b, None


def band_scores(q: Tensor, k: Tensor, n: int) -> Tensor:
    r"""Block tri-diagonal logits: ``[..., T*n, d] x [..., T*n, d] → [..., T, n, 3n]``.

    With all blocks of all leading dims flattened in memory order, entry
    ``[t, r, o*n + c]`` is :math:`q_{tn+r}^\top k_{(t+o-1)n+c}` for
    ``0 < t < T-1``; the first and last block rows are zero (they have no
    two neighbours, so callers put padding there). Differentiable (once).
    """
    lead, d = q.shape[:-2], q.shape[-1]
    out = _BandScores.apply(q.reshape(-1, n, d), k.reshape(-1, d), n)
    return out.reshape(*lead, -1, n, 3 * n)


def band_apply(weights: Tensor, v: Tensor, n: int) -> Tensor:
    """Partner of :func:`band_scores`: ``[..., T, n, 3n] x [..., T*n, c] → [..., T, n, c]``."""
    lead, c = weights.shape[:-2], v.shape[-1]
    out = _BandApply.apply(weights.reshape(-1, n, 3 * n), v.reshape(-1, c), n)
    return out.reshape(*lead, n, c)


# --------------------------------------------------------------------------- hierarchy helpers


def _coarsen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    layout: HMatrixLayout,
    causal: bool,
    key_padding_mask: Tensor | None,
) -> tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor]]:
    r"""Per-level coarse q, k, v ``[B, H, L'/2^l, ·]`` and counts ``[B|1, 1, L'/2^l, 1]``.

    Queries are pre-scaled by :math:`1/\sqrt d`. Values get an extra last
    column, the valid-token count :math:`n_l` (1/0 at level 0); it is summed
    like the values, so the same matmul that gives :math:`Y_l` gives :math:`R_l`.
    """
    batch, heads, length, d = q.shape
    pad = layout.padded_length - length
    valid = q.new_ones(1, 1, length, 1)
    if key_padding_mask is not None:
        valid = (~key_padding_mask).to(q.dtype)[:, None, :, None]
        q, k, v = q * valid, k * valid, v * valid
    q = q * d**-0.5
    v = torch.cat([v, valid.expand(batch, heads, length, 1)], dim=-1)
    if pad:
        q, k, v, valid = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, valid))

    qs, ks, vs, counts = [q], [k], [v], [valid]
    q_sum, k_sum = q, k
    for _ in range(1, layout.num_levels):
        vs.append(_pairsum(vs[-1]))
        counts.append(_pairsum(counts[-1]))
        inverse = 1.0 / counts[-1].clamp_min(1.0)
        k_sum = _pairsum(k_sum)
        ks.append(k_sum * inverse)
        if causal:
            qs.append(qs[-1][:, :, ::2])
        else:
            q_sum = _pairsum(q_sum)
            qs.append(q_sum * inverse)
    return qs, ks, vs, counts


def _band_bias(counts: list[Tensor], rows: list[int], n: int, causal: bool) -> Tensor:
    """Additive ``0 / -inf`` mask ``[B|1, 1, P, n, 3n]`` of the packed band logits.

    A band entry is kept if its key holds a valid token (``count > 0``: not
    padding, not a zero block between levels) and the level structure allows
    it: level-0 blocks keep their whole band (causal: left block + lower
    triangle of the own block); coarse blocks drop their own block and the
    quarters covered by the finer level (causal: keep the left block only).
    """
    count_pack = _pack(counts, n)
    padded = F.pad(count_pack.flatten(), (n, n))
    key_ok = padded.unfold(0, 3 * n, n).reshape(*count_pack.shape[:2], -1, 1, 3 * n) > 0
    r = torch.arange(n, device=key_ok.device).view(n, 1)
    col = torch.arange(3 * n, device=key_ok.device).view(1, 3 * n)
    side, c, half = col // n, col % n, n // 2
    left, own, right = side == 0, side == 1, side == 2
    if causal:
        near = left | (own & (c <= r))
        far = left & ~((r < half) & (c >= half))
    else:
        near = torch.ones_like(left)
        far = (left & ~((r < half) & (c >= half))) | (right & ~((r >= half) & (c < half)))
    num_near = 1 + rows[0] // n  # the leading zero block and level 0
    num_far = key_ok.shape[2] - num_near
    structure = torch.cat([near.expand(num_near, n, 3 * n), far.expand(num_far, n, 3 * n)])
    zero = torch.zeros((), dtype=counts[0].dtype, device=key_ok.device)
    return torch.where(structure & key_ok, zero, -math.inf)


def _pack(xs: list[Tensor], n: int) -> Tensor:
    """Concatenate ``[B, H, L_l, c]`` levels along rows, ``n`` zero rows before, between, after."""
    zeros = xs[0].new_zeros(*xs[0].shape[:2], n, xs[0].shape[-1])
    return torch.cat([zeros, *(part for x in xs for part in (x, zeros))], dim=2)


def _unpack(packed: Tensor, rows: list[int], n: int) -> list[Tensor]:
    """Inverse of :func:`_pack`: split ``[B, H, Σ L_l + (M+1) n, c]`` back into levels."""
    return list(packed.split([n, *(size for r in rows for size in (r, n))], dim=2)[1::2])


def _pairsum(x: Tensor) -> Tensor:
    """Restriction: ``[B, H, 2m, c]`` → ``[B, H, m, c]``, sums of adjacent rows."""
    return x.unflatten(2, (-1, 2)).sum(3)


def _repeat2(x: Tensor) -> Tensor:
    """Prolongation (piecewise-constant interpolation): each row twice."""
    return x.repeat_interleave(2, dim=2)


def _check_block_size(block_size) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"block_size must be an int, got {type(block_size).__name__}")
    if block_size < 2 or block_size % 2:
        raise ValueError(
            f"block_size must be an even int >= 2 (the overlap correction splits blocks "
            f"in halves), got {block_size}"
        )


def _check_inputs(q, k, v, block_size, key_padding_mask) -> None:
    _check_block_size(block_size)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(
                f"{name} must have shape [batch, heads, length, dim], got {tuple(x.shape)}"
            )
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if q.shape != k.shape:
        raise ValueError(
            f"q and k must have the same shape, got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"v must match q in [batch, heads, length], got {tuple(v.shape)} vs {tuple(q.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[2] == 0:
        raise ValueError("sequence length must be >= 1")
    if key_padding_mask is not None:
        expected = (q.shape[0], q.shape[2])
        if key_padding_mask.dtype != torch.bool or tuple(key_padding_mask.shape) != expected:
            raise ValueError(
                f"key_padding_mask must be a bool tensor of shape [batch, length] = {expected} "
                f"(True = padding), got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
            )
