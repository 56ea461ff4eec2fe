r"""The fast path of H-matrix attention, :func:`hmatrix_attention`: all levels packed into
one sequence per (batch, head) and computed by banded block products, with a written
backward (:mod:`hiergraph.ops.hmatrix` for the levels and the implied matrix).
"""

from __future__ import annotations

import functools
import hashlib
import math
import sys
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from hiergraph._autograd import AutogradFunction, differentiable_once
from hiergraph._device import to_device
from hiergraph._precision import autocast_inputs, widened
from hiergraph.data.windows import hmatrix_layout
from hiergraph.ops.hmatrix.inputs import check_inputs


@autocast_inputs
def hmatrix_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    block_size: int,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
) -> Tensor:
    r"""H-matrix attention :math:`Z = \operatorname{softmax}(\hat S)\,V` in :math:`O(L N_r)`.

    See :mod:`hiergraph.ops.hmatrix` for :math:`\hat S`. The sequence is zero-padded
    internally to :math:`L' = N_r 2^M`; padded tokens are never attended.
    Outputs at valid positions do not depend on what padded positions hold,
    but they do depend on :math:`L'` (the hierarchy changes with it).

    Cost per (batch, head): :math:`w N_r^2 (2L'/N_r + M - w)` logits with
    :math:`w = 3` (bidirectional, :math:`\approx 6 L' N_r`) or :math:`w = 2`
    (causal, :math:`\approx 4 L' N_r`), :math:`O(L' (N_r + d))` memory; no
    :math:`L \times L` tensor is formed. All levels are packed into one
    sequence and computed by one banded block matmul (each block against its
    left, own and, if bidirectional, right neighbour; at coarse levels the
    own block is masked, an overhead over the minimal :math:`5 L' N_r` that
    buys a single BLAS-friendly kernel). Forward and backward are written by
    hand (:class:`_HMatrixCore`): the backward reuses the forward's
    exponentials and runs the coarse-to-fine recursion in reverse.

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
            return zeros; so does any row with no valid key. NaN or infinite
            values at padded positions stay there; at valid positions, inputs are
            expected finite: in causal mode a NaN or infinite key or value reaches
            the earlier queries that share a block with it on any level (a masked
            weight is ``0``, and :math:`0 \cdot \mathrm{NaN}` is NaN; for values
            as in :func:`~torch.nn.functional.scaled_dot_product_attention` with
            ``is_causal=True``), where :func:`hmatrix_attention_dense` keeps it out.

    Returns:
        ``[B, H, L, d_v]`` in the inputs' dtype. bfloat16 and float16 inputs are computed
        in float32 (logits, weights, their sums over the levels) and the output is rounded
        once: computed in half precision, the rounded logits alone would cost several times
        the error of that one rounding. Under autocast, ``q, k, v`` are first cast to the
        autocast dtype (as :func:`~torch.nn.functional.scaled_dot_product_attention` casts
        them).
    """
    check_inputs(q, k, v, block_size, causal, key_padding_mask)
    if 0 in q.shape[:3]:  # no query or key: the (empty) result of any attention
        return torch.matmul(torch.matmul(q, k.transpose(-1, -2)), v)
    dtype = q.dtype
    q, k, v = widened(q, k, v)
    plan = _Plan.of(q.shape[2], block_size, causal, q.shape[-1])
    valid = None if key_padding_mask is None else (~key_padding_mask).to(q.dtype)
    out = _HMatrixCore.apply(q, k, v, valid, plan)
    if key_padding_mask is not None:
        out = out.masked_fill(key_padding_mask[:, None, :, None], 0.0)
    return out.to(dtype)


# --------------------------------------------------------------------------- fast path
#
# Packed layout: per (batch, head) sequence, the levels are stacked along the
# row axis as [n zero rows, level 0, n zero rows, level 1, ..., level M-1,
# n zero rows] (P rows, T = P / n blocks of n = N_r rows). The zero
# "separator" blocks give every level block a left and right neighbour, so
# one banded block matmul over all sequences and levels computes every
# level's logits; the bias masks what crosses a separator. Queries and keys share one
# group-major buffer [2, B, H, P, d] (one coarsening pass for both, each group a
# contiguous [B*H*P, d] operand of the products); values carry their counts [1, B, H, P, d_v + 1].


class _Plan(NamedTuple):
    """Static description of one call of :class:`_HMatrixCore`."""

    block_size: int  # n = N_r
    width: int  # blocks per band: 3 (left, own, right) or 2 (causal: left, own)
    scale: float  # 1 / sqrt(d)
    rows: tuple[int, ...]  # L_l = L' / 2^l, coarse rows per level
    length: int  # L, the unpadded length

    @classmethod
    def of(cls, length: int, block_size: int, causal: bool, dim: int) -> _Plan:
        """The plan of ``length`` tokens with query/key channels ``dim``."""
        nr, num_levels, padded = hmatrix_layout(length, block_size)
        rows = tuple(padded >> level for level in range(num_levels))
        return cls(nr, 2 if causal else 3, dim**-0.5, rows, length)

    def fields(self) -> tuple:
        """The plan as the custom ops take it (``rows`` a list)."""
        return (*self._replace(rows=list(self.rows)),)

    def parts(self) -> list[int]:
        """Rows of the packed layout's parts: separator, level 0, separator, ..., separator."""
        n = self.block_size
        return [n, *(size for rows in self.rows for size in (rows, n))]

    @property
    def query_reduce(self) -> str:
        """Coarse queries: ``"first"`` token of the group (causal, no look-ahead) or ``"mean"``."""
        return "first" if self.width == 2 else "mean"

    @property
    def packed_rows(self) -> int:
        return sum(self.parts())


class _HMatrixCore(AutogradFunction):
    r"""Fast H-matrix attention ``(q, k, v [B, H, L, ·], valid [B, L] | None) → Z [B, H, L, d_v]``.

    Forward: coarsen q, k (means of valid tokens; causal queries: first
    token) and :math:`v^+ = [v, 1]` (sums, so the last column is the count
    :math:`n_l`) straight into the packed layout; band logits
    :math:`\tilde S` plus the ``0/-inf`` structure bias; :math:`\mu_l` the
    top-down running row maximum, :math:`E = \exp(\tilde S - \mu)`;
    :math:`Y^+_l = E\,\tilde v^+_l` on every level (its last column is
    :math:`R_l`); coarse to fine
    :math:`\hat Y^+_l = Y^+_l + \alpha_l\,\mathrm{repeat}_2(\hat Y^+_{l+1})` with
    :math:`\alpha_l = e^{\mathrm{repeat}_2(\mu_{l+1}) - \mu_l} \le 1`; and
    :math:`Z = \hat Y / \hat R`.

    Backward (:math:`\mu` is a constant: :math:`Z` does not depend on it):
    :math:`G^+_0 = [\,dZ / \hat R,\; -(dZ \cdot Z) / \hat R\,]`, fine to coarse
    :math:`G^+_{l+1} = \mathrm{pairsum}(\alpha_l G^+_l)`; then on all levels at
    once :math:`dS = E \odot (G^+ \tilde v^{+\top})`, :math:`d\tilde v^+ = E^\top G^+`,
    :math:`d\tilde q = dS\,\tilde k/\sqrt d`, :math:`d\tilde k = dS^\top \tilde q/\sqrt d`
    in the forward's banded matmuls; finally the coarsening is undone coarse to fine.

    Under ``torch.compile`` both passes run as custom operators
    (``hiergraph::hmatrix_forward_<digest>`` and ``hiergraph::hmatrix_backward_<digest>``,
    see :func:`_opaque_to_compiler`; the digest is of the ops' sources).
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, valid: Tensor | None, plan: _Plan) -> Tensor:
        known = {}  # eager: what the plan fixes, made once on the CPU
        if not torch.compiler.is_compiling():
            known["structure"] = _on(q.device, _plan_structure(plan))
            if valid is None:
                known["counts"] = _on(q.device, _unmasked_counts(plan, q.dtype))
        out, *saved = _opaque_to_compiler(_forward, _forward_op, q, k, v, valid, plan=plan, **known)
        ctx.save_for_backward(out, valid, *saved)
        ctx.plan = plan
        return out

    @staticmethod
    @differentiable_once
    def backward(ctx, grad_out: Tensor):
        out, valid, *saved = ctx.saved_tensors
        grads = _opaque_to_compiler(
            _backward, _backward_op, grad_out, out, valid, saved, plan=ctx.plan
        )
        return *grads, None, None


def _opaque_to_compiler(fn, op, *args, plan: _Plan, **eager):
    """``fn(*args, plan, **eager)``; under ``torch.compile``, the same through the custom op
    ``op`` (without ``eager``).

    The compiler runs ``op`` as one opaque call (its output shapes come from running ``fn`` on
    fake tensors) instead of lowering the packed layout's strided in-place level updates,
    whose index expressions take inductor minutes per level to simplify.
    """
    if torch.compiler.is_compiling():
        return op(*args, *plan.fields())
    return fn(*args, plan, **eager)


def _forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    valid: Tensor | None,
    plan: _Plan,
    counts: tuple[Tensor, Tensor] | None = None,
    structure: tuple[Tensor, Tensor] | None = None,
) -> list[Tensor]:
    """The forward of :class:`_HMatrixCore`: ``[out, *saved]``, what the backward needs.

    ``counts`` (the packed counts and child weights, :func:`_counts`) and ``structure``
    (:func:`_band_structure`): given where they are known already, else made here.
    """
    n, width = plan.block_size, plan.width
    batch, heads, _, dim = q.shape
    counts, child = _counts(valid, q.dtype, q.device, plan) if counts is None else counts
    qk_pack = _coarse_pack((q, k), valid, plan, child)  # [2, B, H, P, d]
    v_pack = _coarse_pack((v,), valid, plan, counts=counts)  # [1, B, H, P, d_v + 1]
    q_flat, k_flat = (qk_pack[group].view(-1, dim) for group in (0, 1))
    v_flat = v_pack.view(-1, v_pack.shape[-1])
    blocks = q_flat.shape[0] // n

    logits = _band_bmm(q_flat.view(blocks, n, dim), _band(k_flat, n, width), plan.scale)
    structure = _band_structure(plan, q.device) if structure is None else structure
    bias = _band_bias(counts, plan, structure)  # [B|1, 1, T_per, n, width * n]
    logits.view(bias.shape[0], -1, *bias.shape[2:]).add_(bias)

    # One shift per fine row: the running max over levels >= l, top-down.
    shift = logits.amax(-1).view(batch * heads, -1)
    for fine, coarse in zip(_pairs(shift, plan)[::-1], _parents(shift, plan)[::-1], strict=True):
        fine.clamp_min_(coarse)
    finite = _finite(shift)
    weights = logits.sub_(finite.view(blocks, n, 1)).exp_()

    # Y⁺_l of all levels at once, then interpolate and accumulate coarse → fine.
    acc = _band_bmm(weights, _band(v_flat, n, width).transpose(1, 2))
    acc = acc.view(batch * heads, -1, v_flat.shape[-1])
    alphas = _alphas(shift, finite, plan)
    levels = zip(
        _pairs(acc, plan), _parents(acc, plan), _pairs(alphas.unsqueeze(-1), plan), strict=True
    )
    for fine, coarse, alpha in reversed(list(levels)):
        fine.addcmul_(coarse, alpha)
    num, den = _levels(acc, plan)[0][:, : plan.length].split([v.shape[-1], 1], dim=-1)
    den = den.clamp_min(1.0)  # R̂ >= 1 where a row has a key (its maximum weighs 1), else 0
    out = (num / den).view(batch, heads, plan.length, -1)
    return [out, qk_pack, v_pack, weights, den, child, alphas]


def _backward(
    grad_out: Tensor, out: Tensor, valid: Tensor | None, saved: list[Tensor], plan: _Plan
) -> list[Tensor]:
    """The backward of :class:`_HMatrixCore`: the gradients of ``q, k, v``."""
    qk_pack, v_pack, weights, den, child, alphas = saved
    n, width = plan.block_size, plan.width
    _, batch, heads, _, dim = qk_pack.shape
    channels = v_pack.shape[-1]
    blocks = weights.shape[0]

    # G⁺ on every level, fine → coarse (separator rows stay zero).
    grad_acc = v_pack.new_zeros(batch * heads, plan.packed_rows, channels)
    grads = _levels(grad_acc, plan)
    grad_out = grad_out.reshape(batch * heads, plan.length, -1)
    grads[0][:, : plan.length, :-1] = grad_out / den
    dot = (grad_out * out.view_as(grad_out)).sum(-1, keepdim=True)
    grads[0][:, : plan.length, -1:] = dot.div_(den).neg_()
    levels = zip(
        *_children(grad_acc, plan), *_children(alphas.unsqueeze(-1), plan), grads[1:], strict=True
    )
    for first, second, alpha_first, alpha_second, coarse in levels:
        torch.mul(first, alpha_first, out=coarse).addcmul_(second, alpha_second)

    # Band matmuls of the backward, all levels at once.
    q_flat, k_flat = (qk_pack[group].view(-1, dim) for group in (0, 1))
    v_flat = v_pack.view(-1, channels)
    grad_v = _key_grad(weights, grad_acc.view(-1, channels), n, width)
    # dS / sqrt(d): the scale goes into the matmul, and from there into dq and dk.
    grad_logits = _band_bmm(grad_acc.view(blocks, n, -1), _band(v_flat, n, width), plan.scale)
    grad_logits.mul_(weights)
    grad_qk = qk_pack.new_empty(2, blocks, n, dim)
    _band_bmm(grad_logits, _band(k_flat, n, width).transpose(1, 2), out=grad_qk[0])
    _key_grad(grad_logits, q_flat, n, width, out=grad_qk[1])

    # Undo the coarsening (adjoint of _coarse_pack).
    grad_q, grad_k = _coarse_unpack(grad_qk.view(2, batch, heads, -1, dim), valid, plan, child)
    grad_v = grad_v.view(1, batch, heads, -1, channels)
    return [grad_q, grad_k, *_coarse_unpack(grad_v, valid, plan, channels=channels - 1)]


#: The plan's fields in the custom ops' schemas (they take no Python objects).
_PLAN_SCHEMA = "SymInt block_size, SymInt width, float scale, SymInt[] rows, SymInt length"


def _source_digest(paths) -> str:
    """The first 10 hex digits of the SHA-1 of the files ``paths`` (taken by name; a file
    that cannot be read, as in an install without sources on disk, by its name alone)."""
    digest = hashlib.sha1()
    for path in sorted(set(paths), key=lambda path: (path.name, str(path))):
        try:
            source = path.read_bytes()
        except OSError:
            source = b""
        digest.update(path.name.encode() + b"\0" + source)
    return digest.hexdigest()[:10]


#: Suffix of the custom ops' names: the digest of their sources (this package and the
#: modules it takes the plan's layout, dtypes and devices from). PyTorch's on-disk compile
#: cache knows a custom op by its name, and a step compiled against one version of the ops
#: (their outputs' shapes, what the forward saves) fails when replayed with another
#: ("mismatch in length of strides and shape"); named by their implementation, two versions
#: of the ops never share a cache entry.
_OP_SUFFIX = _source_digest(
    [
        *Path(__file__).parent.glob("*.py"),
        *(Path(sys.modules[f.__module__].__file__) for f in (hmatrix_layout, widened, to_device)),
    ]
)


def _custom_op(name: str, fn, tensors: str):
    """``fn(*tensors, plan) -> list[Tensor]`` as the custom op
    ``hiergraph::<name>_<_OP_SUFFIX>``, whose arguments are the tensors (``tensors``: their
    schema) and the plan's fields; its fake (shape-only) implementation is ``fn`` itself,
    run on fake tensors."""

    def with_fields(*args):
        *inputs, block_size, width, scale, rows, length = args
        return fn(*inputs, _Plan(block_size, width, scale, tuple(rows), length))

    schema = f"({tensors}, {_PLAN_SCHEMA}) -> Tensor[]"
    qualified = f"hiergraph::{name}_{_OP_SUFFIX}"
    op = torch.library.custom_op(qualified, with_fields, mutates_args=(), schema=schema)
    op.register_fake(with_fields)
    return op


_forward_op = _custom_op("hmatrix_forward", _forward, "Tensor q, Tensor k, Tensor v, Tensor? valid")
_backward_op = _custom_op(
    "hmatrix_backward", _backward, "Tensor grad_out, Tensor out, Tensor? valid, Tensor[] saved"
)


def _band(x: Tensor, n: int, width: int) -> Tensor:
    """``[T*n, c]`` → ``[T-w+1, c, w*n]``: blocks ``s .. s+w-1`` side by side (``w = width``).

    A strided view (overlapping windows of one buffer), not a copy; ``bmm``
    consumes it as is.
    """
    return x.unfold(0, width * n, n)


def _key_grad(entries: Tensor, x: Tensor, n: int, width: int, out: Tensor | None = None) -> Tensor:
    """Per key block, the sum over the query blocks that see it: ``Σ_t entries[t, :, j]ᵀ x[t]``.

    ``entries`` ``[T, n, w*n]`` are band entries in query-major order (row =
    query, column = key, as from :func:`_band_bmm`), ``x`` is ``[T*n, c]``
    (queries, or the gradients of the outputs); returns ``[T, n, c]`` (written
    into ``out`` if given), zero on the blocks that no full band reaches
    (separators). The entries are first copied into key-major order, so the
    matmul contracts over all ``w*n`` query rows of a key block at once (no
    overlapping sums afterwards).
    """
    windows = entries.shape[0] - width + 1
    # window s, query block s+p (p < w), key block s+w-2 ↔ entries[s+p, :, (w-1-p)*n : (w-p)*n]
    stride = entries.stride()
    key_major = entries.as_strided(
        (windows, width, n, n),
        (stride[0], stride[0] - n, stride[1], 1),
        (width - 1) * n,  # entries come from _band_bmm: contiguous, storage offset 0
    ).reshape(windows, width * n, n)
    if out is None:
        out = x.new_empty(entries.shape[0], n, x.shape[-1])
    inner = _inner_blocks(out, width - 2, windows)
    torch.bmm(key_major.transpose(1, 2), _band(x, n, width).transpose(1, 2), out=inner)
    return out


def _band_bmm(a: Tensor, b: Tensor, alpha: float = 1.0, out: Tensor | None = None) -> Tensor:
    """``alpha * a[1:1+S] @ b`` for the ``S = len(b)`` query blocks that have a full band.

    ``a`` is ``[T, n, ·]``, ``b`` is ``[S, ·, ·]``; blocks without a band (the
    first, and the last when ``S = T - 2``) are zero in the ``[T, n, ·]`` output
    (written into ``out`` if given).
    """
    if out is None:
        out = a.new_empty(a.shape[0], a.shape[1], b.shape[-1])
    inner = _inner_blocks(out, 1, b.shape[0])
    torch.baddbmm(inner, a[1 : 1 + b.shape[0]], b, beta=0.0, alpha=alpha, out=inner)
    return out


def _inner_blocks(out: Tensor, start: int, count: int) -> Tensor:
    """``out[start : start + count]``, the blocks of a full band, after zeroing the others: the
    first block (``start = 1``), the last one (``start + count = T - 1``) or both (one write)."""
    last = out.shape[0] - 1
    first_out, last_out = start == 1, start + count == last
    if first_out and last_out:
        out[::last].zero_()
    elif first_out or last_out:
        out[0 if first_out else last].zero_()
    return out.narrow(0, start, count)


def _levels(packed: Tensor, plan: _Plan, dim: int = 1) -> tuple[Tensor, ...]:
    """Views of the levels (``L_l`` rows each) of a tensor packed along ``dim``."""
    return packed.split(plan.parts(), dim)[1::2]


def _pairs(packed: Tensor, plan: _Plan, dim: int = 1) -> tuple[Tensor, ...]:
    """Views of the levels ``l < M - 1`` of a tensor packed along ``dim``, each as
    ``L_l / 2`` pairs of rows (the children of the rows of level ``l + 1``): dimension
    ``dim`` becomes ``[L_l / 2, 2]``."""
    return _below_top(packed.unflatten(dim, (-1, 2)), plan, dim)


def _children(packed: Tensor, plan: _Plan, dim: int = 1) -> tuple[tuple[Tensor, ...], ...]:
    """:func:`_pairs` as two tuples of views: the first and the second children."""
    pairs = packed.unflatten(dim, (-1, 2))
    return tuple(_below_top(pairs.select(dim + 1, child), plan, dim) for child in (0, 1))


def _below_top(halved: Tensor, plan: _Plan, dim: int) -> tuple[Tensor, ...]:
    """The levels ``l < M - 1`` of a packed tensor whose dimension ``dim`` counts row pairs."""
    if len(plan.rows) == 1:  # one level: no parents (and a block size that may be odd)
        return ()
    return halved.split([size // 2 for size in plan.parts()], dim)[1:-2:2]


def _parents(packed: Tensor, plan: _Plan, dim: int = 1) -> tuple[Tensor, ...]:
    """Views of the levels ``l >= 1`` of a tensor packed along ``dim``, each with a new
    dimension of size 1 after ``dim``: the parents of :func:`_pairs`' rows, broadcast
    against them."""
    return packed.unsqueeze(dim + 1).split(plan.parts(), dim)[3::2]


def _alphas(shift: Tensor, finite: Tensor, plan: _Plan) -> Tensor:
    r""":math:`\alpha_l = e^{\mathrm{repeat}_2(\mu_{l+1}) - \mu_l}` of every level ``l < M - 1``,
    packed like the rows ``[S, P]`` (the top level and the separators hold 1, unused).

    ``shift``: the row shifts :math:`\mu`. :math:`\alpha = 0` where the coarser row has no
    key (:math:`\mu_{l+1} = -\infty`); ``finite`` is ``_finite(shift)`` (a row without keys
    subtracts 0). Kept for the backward.
    """
    alphas = finite.new_zeros(finite.shape)
    levels = zip(_pairs(finite, plan), _parents(shift, plan), _pairs(alphas, plan), strict=True)
    for fine, coarse, out in levels:
        torch.sub(coarse, fine, out=out)
    return alphas.exp_()


def _finite(shift: Tensor) -> Tensor:
    """Row shifts with ``-inf`` (rows without any key) replaced by 0."""
    return shift.masked_fill(shift == -math.inf, 0.0)


def _packed_counts(valid: Tensor | None, like: Tensor, plan: _Plan) -> Tensor:
    """Valid tokens below every packed row, ``[B|1, 1, P, 1]`` (0 on separators and padding)."""
    counts = like.new_zeros(1 if valid is None else valid.shape[0], 1, plan.packed_rows, 1)
    levels = _levels(counts, plan, dim=2)
    if valid is None:
        levels[0][:, :, : plan.length] = 1.0
    else:
        levels[0][:, 0, : plan.length, 0] = valid
    for first, second, coarse in zip(*_children(counts, plan, dim=2), levels[1:], strict=True):
        torch.add(first, second, out=coarse)
    return counts


def _counts(valid: Tensor | None, dtype: torch.dtype, device, plan: _Plan) -> tuple[Tensor, Tensor]:
    """:func:`_packed_counts` and :func:`_child_weights` in ``dtype`` (float32 or float64:
    :func:`hmatrix_attention` computes half-precision inputs in float32) on ``device``."""
    counts = _packed_counts(valid, torch.empty(0, dtype=dtype, device=device), plan)
    return counts, _child_weights(counts, plan)


@functools.lru_cache(maxsize=32)
def _unmasked_counts(plan: _Plan, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """:func:`_counts` of a sequence without padding, made once per plan on the CPU, where
    its small level operations cost no device launches. Read-only."""
    return _counts(None, dtype, "cpu", plan)


@functools.lru_cache(maxsize=32)
def _plan_structure(plan: _Plan) -> tuple[Tensor, Tensor]:
    """:func:`_band_structure`, made once per plan on the CPU. Read-only."""
    return _band_structure(plan, "cpu")


def _on(device, tensors: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """CPU ``tensors`` on ``device`` (:func:`~hiergraph._device.to_device`)."""
    return tuple(to_device(t, device) for t in tensors)


def _child_weights(counts: Tensor, plan: _Plan) -> Tensor:
    r"""Packed weights of every row in its parent's coarse query and key, ``[G, B|1, 1, P, 1]``.

    Keys (and queries unless causal) take the mean: a row's weight is
    :math:`n_l(i) / n_{l+1}(\lfloor i/2 \rfloor)`, 0 where the parent has no valid token.
    Causal queries take the first token of the group: weight 1 on the even rows (the first
    child), 0 on the odd ones. ``G = 1`` (one weight for queries and keys) or ``G = 2``
    (causal: queries, keys).
    """
    groups = 1 if plan.query_reduce == "mean" else 2
    weights = counts.new_zeros(groups, *counts.shape)
    if groups == 2:
        weights[0, :, :, 0::2] = 1.0  # level starts are even: the even rows are first children
    means = _pairs(weights[-1], plan, dim=2)
    parents = _parents(counts.clamp_min(1.0), plan, dim=2)
    for fine, coarse, out in zip(_pairs(counts, plan, dim=2), parents, means, strict=True):
        torch.div(fine, coarse, out=out)
    return weights


def _coarse_pack(
    xs: tuple[Tensor, ...],
    valid: Tensor | None,
    plan: _Plan,
    weights: Tensor | None = None,
    counts: Tensor | None = None,
) -> Tensor:
    """Coarsen the inputs ``xs`` (``[B, H, L, c]`` each) into one packed buffer
    ``[G, B, H, P, c (+1)]``, input ``g`` in group ``g``.

    A row of level ``l + 1`` is its children's sum, weighted by ``weights``
    (:func:`_child_weights`: the mean of valid tokens, or the first token) if given; with
    ``counts``, a last column carries the valid-token counts (summed like the values). The
    buffer starts zeroed: separators and padding rows need no writes of their own.
    """
    batch, heads, length, dim = xs[0].shape
    extra = 0 if counts is None else 1
    out = xs[0].new_zeros(len(xs), batch, heads, plan.packed_rows, dim + extra)
    levels = _levels(out, plan, dim=3)
    first = levels[0][..., :length, :]
    padding = None if valid is None else valid[:, None, :, None] == 0
    for group, x in enumerate(xs):
        # masked_fill, not a product: NaN/inf at padded positions must not leak
        first[group, ..., :dim] = x if padding is None else x.masked_fill(padding, 0.0)
    if counts is not None:
        first[..., dim:] = _levels(counts, plan, dim=2)[0][:, :, :length]
    firsts, seconds = _children(out, plan, dim=3)
    if weights is None:
        for first, second, coarse in zip(firsts, seconds, levels[1:], strict=True):
            torch.add(first, second, out=coarse)
        return out
    scales = zip(firsts, seconds, *_children(weights, plan, dim=3), levels[1:], strict=True)
    for first, second, scale_first, scale_second, coarse in scales:
        torch.mul(first, scale_first, out=coarse).addcmul_(second, scale_second)
    return out


def _coarse_unpack(
    grad: Tensor,
    valid: Tensor | None,
    plan: _Plan,
    weights: Tensor | None = None,
    channels: int | None = None,
) -> tuple[Tensor, ...]:
    """Adjoint of :func:`_coarse_pack`: packed ``[G, B, H, P, c]`` gradient → one
    ``[B, H, L, channels]`` gradient per group (its first ``channels``; default all).

    Accumulates every level into its children, coarse to fine, in place. The gradients are
    new contiguous tensors: they alias neither ``grad`` nor each other.
    """
    children, parents = _pairs(grad, plan, dim=3), _parents(grad, plan, dim=3)
    scales = _pairs(weights, plan, dim=3) if weights is not None else [None] * len(children)
    for fine, coarse, scale in reversed(list(zip(children, parents, scales, strict=True))):
        if scale is None:
            fine.add_(coarse)
        else:
            fine.addcmul_(coarse, scale)
    first = _levels(grad, plan, dim=3)[0][..., : plan.length, :channels]
    if valid is None:
        return tuple(x.clone(memory_format=torch.contiguous_format) for x in first)
    return tuple(x * valid[:, None, :, None] for x in first)


def _band_structure(plan: _Plan, device) -> tuple[Tensor, Tensor]:
    """Which band entries the level structure keeps, as ``patterns [3, n, width*n]`` (bool:
    a separator block keeps nothing, level 0 its near band, a coarse level its far band)
    and ``kinds [T]`` (int64: the pattern of every packed block).

    Level-0 blocks keep their whole band (causal: left block + lower triangle of the own
    block); coarse blocks drop their own block and the quarters covered by the finer level
    (causal: keep the left block only).
    """
    n, width = plan.block_size, plan.width
    r = torch.arange(n, device=device).view(n, 1)
    col = torch.arange(width * n, device=device).view(1, width * n)
    side, c, half = col // n, col % n, n // 2
    left = (side == 0) & ~((r < half) & (c >= half))
    right = (side == 2) & ~((r >= half) & (c < half))
    if width == 2:
        near, far = (side == 0) | ((side == 1) & (c <= r)), left
    else:
        near, far = torch.ones_like(left), left | right
    patterns = torch.stack([torch.zeros_like(left), near, far])
    kinds = [0, *(kind for level in range(len(plan.rows)) for kind in (min(level + 1, 2), 0))]
    blocks = [size // n for size in plan.parts()]
    parts = (
        torch.full((size,), kind, device=device) for kind, size in zip(kinds, blocks, strict=True)
    )
    return patterns, torch.cat(list(parts))


def _band_bias(counts: Tensor, plan: _Plan, structure: tuple[Tensor, Tensor]) -> Tensor:
    """Additive ``0 / -inf`` mask ``[B|1, 1, T, n, width*n]`` of one packed sequence's band logits.

    A band entry is kept if its key holds a valid token (``count > 0``: not
    padding, not a separator block) and the level structure allows it
    (``structure``: :func:`_band_structure`).
    """
    n, width = plan.block_size, plan.width
    padded = F.pad(counts.flatten(1), (n, n if width == 3 else 0))
    key_ok = padded.unfold(1, width * n, n).unsqueeze(2) > 0  # [B|1, T, 1, width*n]
    patterns, kinds = structure
    zero = torch.zeros((), dtype=counts.dtype, device=key_ok.device)
    return torch.where(patterns[kinds] & key_ok, zero, -math.inf).unsqueeze(1)
