r"""Sibling attention in PyTorch's fused CPU attention kernel
(``scaled_dot_product_attention``'s flash kernel, which returns the log-partition too).

The kernel takes one channel count for queries, keys and values and a scale: the logits
:math:`\tau\, q^\top k + \varepsilon^\top\varepsilon` of families ``q, k [..., b, d]``
with values ``v [..., b, d_v]`` and position embeddings ``e [..., b, c]`` are those of
:math:`[\tau q, \varepsilon, 0]^\top [k, \varepsilon, 0]`, the values are :math:`[v, 0]`,
each zero-padded to ``max(d + c, d_v) + 1`` channels, the last of which carries the
log-partition's gradient in the backward (:func:`fused_channels`,
:func:`fused_gradients`, :func:`fused_input_gradients`). Two paths run on it: the wide
blocks of the dense kernel (:mod:`~hiergraph.ops.hsa.family_dense`), and the leaf
families of the equal-fanout paths, :func:`leaf_family_attention` (over the siblings, or
the left siblings as the kernel's causal attention). Second derivatives differentiate the
same softmax on tensor operations (:func:`recorded_softmax`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from hiergraph._autograd import AutogradFunction, recorded_gradients
from hiergraph.ops.hsa.family import left_out
from hiergraph.ops.hsa.family_products import family_gram, family_product
from hiergraph.ops.logspace import masked_softmax

#: Narrowest leaf families whose left-sibling attention (the strictly causal views,
#: :mod:`~hiergraph.ops.hsa.causal_uniform`) runs in the fused kernel
#: (:func:`leaf_family_attention`): its causal tiles skip the upper half, so it pays off at
#: half the width of :data:`~hiergraph.ops.hsa.family_dense.WIDE_BLOCK`. Forward+backward of
#: the strictly causal op over stars of 256, 128 and 64 leaves (4 heads x 64, 2 threads):
#: 0.76x, 1.0x and 1.34x the time of the reshaped views' products; trees of 2 and 4
#: families of 256: 0.92x, 0.85x.
WIDE_LEFT_LEAVES = 256


def fused_kernel_applies(q: Tensor) -> bool:
    """Whether wide blocks over rows like ``q`` can run in the fused CPU attention kernel:
    float32 or float64 CPU rows, eager."""
    return (
        q.device.type == "cpu"
        and q.dtype in (torch.float32, torch.float64)
        and not torch.compiler.is_compiling()
    )


#: The fused kernel's forward, ``(out, lse)`` of queries, keys and values ``[..., r, c]``.
fused_attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu

_fused_attention_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


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
            out, lse = fused_attention(*_left_rows(q1, k1, v1), is_causal=True, scale=1.0)
            # the first leaf has no key: lse -inf, theta 0
            out, lse = F.pad(out, (0, 0, 1, 0)), F.pad(lse, (1, 0), value=-math.inf)
        else:  # b >= 2: every leaf has a sibling
            out, lse = fused_attention(q1, k1, v1, attn_mask=_self_bias(q), scale=1.0)
        ctx.save_for_backward(q, k, v, e, q1, k1, v1, out, lse)
        ctx.tau, ctx.left_only = tau, left_only
        return lse, out[..., : v.size(-1)]

    @staticmethod
    def backward(ctx, grad_lse, grad_theta):
        q, k, v, e, q1, k1, v1, out, lse = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the recorded op
            keep = ~left_out(q.size(-2), ctx.left_only, q.device)

            def recorded(q, k, v, e):
                return recorded_softmax(q, k, v, e, ctx.tau, keep)

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


def _padded(parts: list[Tensor], width: int) -> Tensor:
    """``parts`` ``[F, H, W, ·]`` joined along the channels and zero-padded to ``width``."""
    pad = width - sum(t.size(-1) for t in parts)
    return torch.cat([*parts, parts[0].new_zeros(*parts[0].shape[:-1], pad)], -1)


def recorded_softmax(q, k, v, e, tau, mask, bias=None) -> tuple[Tensor, Tensor]:
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
