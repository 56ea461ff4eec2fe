r"""HSA over forests whose levels have equal fanout, as reshaped views.

When every node of depth :math:`d - 1` has the same number :math:`b_d \ge 2` of
children and all leaves sit on the last level (every
:func:`~hiergraph.data.window_hierarchy` whose length is a product of its
branching, and any batch of equal such trees), the breadth-first layout of a
level is the row-major layout of a ``[B, b_1, …, b_d]`` array: a family is a
run of :math:`b_d` consecutive rows and a node's parent is row
``i // b_d`` of the level above. The two passes of
:func:`~hiergraph.ops.hierarchical_attention` then need no gathers, scatters or
per-family bookkeeping. Everything is held *heads first*
(:mod:`~hiergraph.ops.hsa.heads_first`): a level's nodes in the *node layout*
``[H, n_d, ·]`` and its families in the *family layout* ``[H, F_d, b_d, ·]`` (``F_d`` =
nodes of depth :math:`d - 1`), which is the same memory viewed with one more dimension. So

* pooling a level to its parents is a mean over dim 2, whose result is the
  parents' node layout ``[H, F_d, ·]`` and, viewed, their own family layout;
* family attention is a batched product ``[H, F_d, b_d, c] @ [H, F_d, c, b_d]``
  with a fixed ``[b_d, b_d]`` pair mask (families of two need no softmax: a node's one
  key is its sibling);
* broadcasting parent rows to their children is ``unsqueeze(2)``.

Each level costs a fixed, small number of tensor operations on static shapes, for every
tree and head at once, with no copies between layouts and no host synchronisation. When a
gradient is taken, on up to 4M elements (32M off the CPU), the op is one autograd node
whose backward is written out (:mod:`~hiergraph.ops.hsa.uniform_fused`, :func:`fused`;
without masked leaves its leaf level reads node-major inputs in place as below), and when
no input needs a gradient (inference) its passes run alone (:func:`fused_forward`);
otherwise (``leaky_causal``, larger inputs, ``torch.compile``) every operation is
recorded: the path runs under ``torch.compile(fullgraph=True)`` and is differentiable
twice (its small autograd functions, :func:`scores`,
:func:`~hiergraph.ops.hsa.family_products.family_product`,
:func:`~hiergraph.ops.hsa.family_products.family_sum` and
:func:`~hiergraph.ops.hsa.heads_first.dense_gradient`, have backwards made of
differentiable operations). Inputs whose memory is heads first (``[H, L, d]`` storage
viewed as ``[L, H, d]``) are read as they are. Contiguous ``[L, H, d]`` inputs
(of a few million elements at most when gradients are taken) are read in place too, by the
leaf level (one product per head on strided views, :mod:`~hiergraph.ops.hsa.token_layout`),
whose result is written in their layout; only the level's pooled means go heads first. A
leaf mask then weighs the leaves' sums (one batched product per input) and zeroes the
output's masked rows. Otherwise (families of two, one head or many, large inputs; without
gradients more heads and any size qualify: :func:`~hiergraph.ops.hsa.token_layout.fits`)
they are copied heads first (``q.transpose(0, 1)``), and those copies (in and out, and
their adjoints) also zero the padding rows, so a mask costs no pass of its own over the
leaves. The output has the memory layout of ``q``.

On the CPU, where it applies (:func:`~hiergraph.ops.hsa.native.applies`), the compiled
kernel of :mod:`~hiergraph.ops.hsa.native` runs the op instead, leaf masks and gradients
included; on a GPU, when turned on and where they apply
(:func:`~hiergraph.ops.hsa.triton_uniform.applies`), the Triton kernels of
:mod:`~hiergraph.ops.hsa.triton_uniform` do; what follows is the path everywhere else.

The formulas are those of :func:`~hiergraph.ops.hierarchical_attention`; with
all leaves valid, :math:`n(\cdot)` is constant on a level, so
:math:`\log n(B)` shifts every logit of a level by the same amount: it moves
:math:`\mathrm{lse}` and leaves the weights alone, and the count ratios of the
energy :math:`a(A)` are :math:`1 / b`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from hiergraph._autograd import AutogradFunction, records_grad
from hiergraph._precision import accumulation_dtype
from hiergraph.ops.hsa import (
    family,
    family_dense,
    family_fused,
    native,
    token_layout,
    triton_uniform,
    uniform_fused,
)
from hiergraph.ops.hsa.family_products import (
    family_diagonal,
    family_gram,
    family_product,
    family_sum,
)
from hiergraph.ops.hsa.heads_first import (
    dense_gradient,
    family_layout,
    heads_first,
    is_heads_first,
    like,
    node_layout,
    tie_leaves,
    transposed,
)
from hiergraph.ops.logspace import log_gates, logaddexp, softmax_dropping


def uniform_hierarchical_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    shape: tuple[int, ...],
    eps: list[Tensor] | None,
    *,
    include_self: bool,
    left_only: bool,
    leaf_mask: Tensor | None,
    tau: float,
    size_bias: bool,
    padding: bool = False,
    above: Callable[[Tensor, list[Tensor]], tuple[Tensor, Tensor]] | None = None,
    fuse: bool = True,
) -> Tensor:
    r"""HSA of ``q, k [L, H, d]``, ``v [L, H, d_v]`` over an equal-fanout forest.

    It runs, where each applies, by the kernels, as one autograd node with a written
    backward (or its passes alone, without gradients), or with every operation recorded.

    Args:
        shape: ``(B, b_1, …, b_D)``: ``B`` trees, ``b_d >= 2`` children of
            every node of depth :math:`d - 1`; ``L = B b_1 \cdots b_D``.
        eps: optional position embeddings per depth ``d = 1 … D``, each
            ``[H | 1, n_d, c]`` in breadth-first order
            (:func:`~hiergraph.ops.hsa.heads_first.per_depth`).
        include_self, leaf_mask, size_bias: as in
            :func:`~hiergraph.ops.hierarchical_attention`.
        left_only: its ``leaky_causal`` (keys are the left siblings only).
        tau: the logit scale.
        padding: the masked leaves are padding whose rows of ``q, k, v`` are zero and
            whose outputs nobody reads (:mod:`hiergraph.ops.hsa.padded`): the leaves'
            sums then need no count weights, and the outputs no zeroing.
        above: a family above the roots (:mod:`~hiergraph.ops.hsa.lifted`): called with
            the roots' energies :math:`a` ``[H, B]`` and pooled ``[q, k, v]``
            ``[H, B, ·]`` (0 for a root without valid leaves; in the passes' dtype, float32
            for bf16/fp16 inputs without gradients), it returns the log of the mass that
            reaches every root ``[H, B]`` and the output every root hands down
            ``[H, B, d_v]``, where the top-down pass starts (without it: mass 1, output 0).
        fuse: run as one autograd node with a written backward where :func:`fused`
            allows (``False``: every operation recorded by autograd).

    Returns:
        ``[L, H, d_v]``.
    """
    fanout = shape[1:]
    tie_leaves(shape, q, k, v, leaf_mask)
    options = dict(include_self=include_self, tau=tau, size_bias=size_bias)

    def recorded(q, k, v, eps):  # the op on [L, H, ·] rows, recorded (second derivatives)
        return uniform_hierarchical_attention(
            q, k, v, shape, eps, left_only=False, leaf_mask=leaf_mask, padding=padding,
            fuse=False, **options,
        )  # fmt: skip

    kernel_grad = kernel_gradients(q, k, v, eps, left_only, above) if fuse else None
    if kernel_grad is not None:
        out = _kernels(
            q, k, v, fanout, eps, recorded if kernel_grad else None, leaf_mask, above, options
        )
        if out is not None:
            return out
    # Padding leaves count 0: the counts drop them from every key set and pooled mean
    # (their values, if finite, never reach another row), and their outputs are zeroed at
    # the end
    weight = None if leaf_mask is None else leaf_mask.to(accumulation_dtype(q.dtype))
    grad = records_grad(q, k, v)
    # no gradient at all (inference): the fused op's passes alone, which take fewer
    # operations, masked leaves too
    alone = kernel_grad is False
    # node-major leaves are read where they lie (token_layout): more heads without
    # gradients, and families of two by the passes alone
    tokens = all(token_layout.fits(t, fanout[-1], grad, pairs=alone) for t in (q, k, v))
    if alone or fuse and fused(q, grad, left_only, above):
        return _fused(
            q, k, v, fanout, eps, weight, recorded, padding=padding, tokens=tokens,
            alone=alone, above=above, **options,
        )  # fmt: skip
    return _recorded(
        q, k, v, fanout, eps, weight, padding=padding, tokens=tokens, left_only=left_only,
        above=above, **options,
    )  # fmt: skip


def _kernels(q, k, v, fanout, eps, recorded, leaf_mask, above, options) -> Tensor | None:
    """:func:`uniform_hierarchical_attention` by the kernels (Triton's on a GPU when turned
    on, the compiled CPU kernel) where they apply (``None`` where neither does). Both read
    the leaves where they lie, count the valid leaves themselves, and take ``recorded``
    (the op recorded by autograd, for second derivatives; ``None``: no gradient, and a
    family above the roots may be given)."""
    call = dict(recorded=recorded, leaf_mask=leaf_mask, above=above)
    if triton_uniform.applies(q, k, v, fanout, eps, leaf_mask):
        try:
            return triton_uniform.triton_uniform_attention(q, k, v, fanout, eps, **call, **options)
        except triton_uniform.KernelsUnavailable:  # warned and turned off: the paths below
            pass
    if native.applies(q, k, v, fanout, eps, recorded is not None):
        return native.native_uniform_attention(q, k, v, fanout, eps, **call, **options)
    return None


def _fused(
    q, k, v, fanout, eps, weight, recorded, *, padding, tokens, alone, above, **options
) -> Tensor:  # fmt: skip
    """:func:`uniform_hierarchical_attention` as one autograd node with a written backward
    (:mod:`~hiergraph.ops.hsa.uniform_fused`), or its passes ``alone`` (no gradient).
    ``weight`` ``[L]`` (or ``None``) weighs the valid leaves; ``tokens``: node-major leaves
    may be read where they lie. The output comes in the layout of node-major leaves;
    copies heads first zero the rows of masked leaves (counts 0), and take bf16/fp16 leaves
    to float32, the passes' dtype (the output goes back to theirs)."""
    masked = weight is not None and not padding  # rows of masked leaves that are not zero
    work = accumulation_dtype(q.dtype)
    tokens = tokens and work == q.dtype and (alone or weight is None)
    counts = None if weight is None else counts_below(weight, fanout)
    if tokens:
        leaves = (q, k, v)
    elif masked:
        leaves = [transposed(t, weight[:, None, None], work) for t in (q, k, v)]
    else:
        leaves = [heads_first(t, work) for t in (q, k, v)]
    eps = None if eps is None else [e.to(work) for e in eps]
    if alone:  # no gradient: the passes alone
        recorded = None
    elif not tokens:
        recorded = _on_heads_first(recorded)
    out = uniform_fused.fused_uniform_attention(
        *leaves, fanout, eps, recorded=recorded, node_major=tokens, counts=counts,
        above=above, **options,
    )  # fmt: skip
    if not tokens:
        return like(out, q, weight if masked else None)
    return out * weight[:, None, None].to(out.dtype) if masked else out


def _on_heads_first(op: Callable) -> Callable:
    """``op(q, k, v, eps)`` on ``[L, H, ·]`` rows, called with heads-first ``[H, L, ·]``
    rows and returning them (the fused op's layout)."""
    return lambda q, k, v, eps: op(*(t.transpose(0, 1) for t in (q, k, v)), eps).transpose(0, 1)


def _recorded(
    q, k, v, fanout, eps, weight, *, padding, tokens, left_only, above, include_self, tau,
    size_bias,
) -> Tensor:  # fmt: skip
    """:func:`uniform_hierarchical_attention` with every operation recorded by autograd
    (differentiable twice, and under ``torch.compile``): the bottom-up pass
    (:func:`bottom_up`), then the top-down pass. Inputs that are not heads first are
    copied anyway: that copy zeroes the rows of masked leaves too, so the leaves' sums need
    no count weights."""
    depth = len(fanout)
    counts = counts_below(weight, fanout)
    masked = weight is not None and not padding  # rows of masked leaves that are not zero
    zero_rows = masked and not tokens and not is_heads_first(q)
    if tokens:
        rho = [token_layout.token_families(t, fanout[-1]) for t in (q, k, v)]
    else:
        if zero_rows:
            leaves = [transposed(t, weight[:, None, None]) for t in (q, k, v)]
        else:
            leaves = [heads_first(t) for t in (q, k, v)]
        rho = [family_layout(t, fanout[-1]) for t in leaves]
    passes = dict(padding=padding or zero_rows, tokens=tokens)
    if above is not None:
        passes["root_counts"] = counts[0] * fanout[0] if weight is None else counts[0].sum(-1)
    lses, probs, gates, rhos, roots = bottom_up(
        rho, counts, fanout, eps, tau, include_self=include_self, left_only=left_only,
        size_bias=size_bias, **passes,
    )  # fmt: skip
    finite = finite_energies(counts, include_self)  # log_gates then takes -inf lse values

    # ---- top-down: log mass u and output accumulator, parents broadcast by unsqueeze.
    # The gain of a row scales its [b] weights before the product with the values, not
    # the [d_v] product: theta = p v is never formed.
    # The leaves' own weights exp(u) go onto the diagonal of their families' weights (a
    # leaf is not its own sibling: that diagonal is 0), so the last product adds them.
    u, acc = (None, None) if above is None else above(*roots)
    for d in range(depth):
        if gates[d] is None:  # leaves without self energy: mu = 0
            log_mu, log_rest = None, None
        else:
            log_mu, log_rest = log_gates(gates[d], lses[d], finite)
        down = _add(u, log_rest)
        p = probs[d] if down is None else torch.exp(down).unsqueeze(-1) * probs[d]
        u = None if log_mu is None else _add(u, log_mu)
        if d + 1 == depth and include_self:
            p = p + torch.diag_embed(torch.exp(u))
        if d + 1 == depth and tokens:  # the output, in the leaves' node-major memory
            base = None if acc is None else acc.unsqueeze(2)
            out = token_layout.token_product(p, rhos[d][2], base).flatten(0, 1)
            return out * weight[:, None, None].to(out.dtype) if masked else out
        acc = _weighted_sum(acc, p, rhos[d][2])
        if d + 1 < depth:
            acc, u = node_layout(acc), None if u is None else node_layout(u)
    out = dense_gradient(node_layout(acc))
    return like(out, q, None if padding else weight)


def kernel_gradients(
    q: Tensor, k: Tensor, v: Tensor, eps, left_only: bool, above=None
) -> bool | None:
    """Whether the kernels (Triton's, the compiled CPU kernel) may run
    :func:`uniform_hierarchical_attention`'s op, and how, where they apply to its tensors:
    ``False`` without gradients (inference: the passes alone; a family above the roots
    too), ``True`` with those of ``q, k, v`` (and of ``eps``; no family above the roots),
    ``None`` not at all (:func:`fused_forward` refuses, or only ``eps`` takes a gradient)."""
    if not fused_forward(left_only):
        return None
    if not records_grad(q, k, v):
        return None if records_grad(*(eps or ())) else False
    return True if above is None else None


def fused(q: Tensor, grad: bool, left_only: bool, above) -> bool:
    """Whether the op runs as one autograd node with a written backward
    (:mod:`~hiergraph.ops.hsa.uniform_fused`): a gradient is taken, on at most
    :func:`~hiergraph.ops.hsa.uniform_fused.max_elements` elements of ``q``, with no
    family above the roots, and :func:`fused_forward` allows it (the options of
    :func:`uniform_hierarchical_attention`). Masked leaves are read heads first, their
    rows zeroed."""
    return (
        grad
        and q.numel() <= uniform_fused.max_elements(q.device)
        and above is None
        and fused_forward(left_only)
    )


def fused_forward(left_only: bool) -> bool:
    """Whether the passes of :mod:`~hiergraph.ops.hsa.uniform_fused` apply: outside
    ``torch.compile``, with every sibling a key. They run in float32 or float64 (bf16/fp16
    leaves are cast to float32 by their copy heads first). Without a gradient they then run
    alone, masked leaves and a family above the roots included
    (:func:`~hiergraph.ops.hsa.uniform_fused.fused_uniform_attention` without
    ``recorded``)."""
    return not left_only and not torch.compiler.is_compiling()


def fits(shape: tuple[int, ...] | None, q: Tensor, causal: bool = False) -> bool:
    """Whether an equal-fanout forest ``shape`` runs as reshaped views with ``q``'s heads
    and channels: its largest logits hold at most ``max(MAX_BLOCK_ELEMENTS, L H d)``
    elements (the block limit of :mod:`hiergraph.ops.hsa.family_dense`; ``L`` the forest's
    leaves, which a padded forest has more of than ``q`` rows). Those are
    ``[F_d, H, b_d, b_d]`` per level, and for the strictly causal op ``[L, H, b_d]`` per
    depth (every leaf's prefix query against its ancestor's family). A forest with giant
    families goes to the general kernels, which run them in chunks of rows."""
    if shape is None:
        return False
    heads, leaves = q.size(1), math.prod(shape)
    limit, nodes = max(family_dense.MAX_BLOCK_ELEMENTS, leaves * heads * q.size(2)), shape[0]
    for b in shape[1:]:
        nodes *= b  # the level's nodes: F_d * b_d
        if (leaves if causal else nodes) * heads * b > limit:
            return False
    return True


class BottomUp(NamedTuple):
    r"""What :func:`bottom_up` returns, per level ``d`` (depth ``d + 1``, family layout):
    ``lses``, ``probs`` (the weights ``p``, or :math:`\vartheta` at fused leaves),
    ``gates`` (the energies ``a``) and ``rhos`` (the level's ``[q, k, v]``), as described
    there; ``roots``: the roots' energies ``[H, B]`` and pooled ``[q, k, v]`` ``[H, B, ·]``,
    or ``None`` where the pass stops at their children."""

    lses: list[Tensor]
    probs: list[Tensor]
    gates: list[Tensor | None]
    rhos: list[list[Tensor]]
    roots: tuple[Tensor, list[Tensor]] | None


def bottom_up(
    rho, counts, fanout, eps, tau, *, include_self, left_only, size_bias, padding=False,
    tokens=False, root_counts=None, fused_leaves=False,
) -> BottomUp:  # fmt: skip
    r"""The bottom-up pass from the leaves (``rho``: their ``q, k, v`` in family layout) to
    the roots' children (:class:`BottomUp`). Per level ``d`` (depth ``d + 1``), in family
    layout: ``lse [H, F, b]``, the family softmax ``p [H, F, b, b]`` (:math:`\vartheta` is
    ``p @ rho[2]``), the energies ``a`` (``None``: ``-inf``) and the pooled ``rho``.
    With ``fused_leaves`` (every leaf valid) the leaves' families run in PyTorch's fused
    CPU attention kernel (:func:`~hiergraph.ops.hsa.family_fused.leaf_family_attention`), and
    their entry holds :math:`\vartheta` ``[H, F, b, d_v]`` in place of ``p``.
    With ``padding`` (masked leaves have zero rows), the leaves' sums are plain sums; with
    ``tokens`` the leaves come node-major, ``[F, b, H, ·]`` (:mod:`token_layout`). Given
    the roots' leaf counts ``root_counts`` (an int, or ``[1, B]``), the pass goes on to
    the roots and also returns their energies ``[H, B]`` and pooled ``[q, k, v]``
    ``[H, B, ·]`` (``roots``).

    The leaves' self energies :math:`\tau q_i^\top k_i + \varepsilon_i^\top\varepsilon_i`
    (``include_self``) are the diagonal of their families' logits, read from them rather
    than computed again."""
    depth = len(fanout)
    finite = dict(
        finite=all_finite(counts, left_only), finite_a=finite_energies(counts, include_self)
    )
    lses, probs, gates, rhos = [None] * depth, [None] * depth, [None] * depth, [None] * depth
    energy = None  # a(C) of the level's nodes; None: -inf (leaves without self energy)
    masked = not isinstance(counts[0], int)
    weighted = None  # n(C) rho(C) of a masked level's nodes: the sums its means came from
    for d in range(depth - 1, -1, -1):
        b, n = fanout[d], counts[d]
        e = None if eps is None else family_layout(eps[d], b)
        # the rows' sums need no count weights: equal counts, or padding rows of zeros
        plain = isinstance(n, int) or (padding and d == depth - 1)
        # those of q and k then come with the logits (pooled below; at the top only for
        # the roots' statistics)
        pools = d > 0 or root_counts is not None
        sums_dtype = accumulation_dtype(rho[0].dtype) if plain and pools else None
        leaves = tokens and d == depth - 1
        # a leaf counts 1 (0: no key), so log n(B) adds nothing on the last level
        bias = size_bias and d < depth - 1
        if fused_leaves and d == depth - 1:
            lses[d], probs[d] = family_fused.leaf_family_attention(*rho, e, tau, left_only)
            qk_sums = []
            if include_self:  # tau q_i . k_i + e_i . e_i
                energy = tau * (rho[0] * rho[1]).sum(-1)
                energy = energy if e is None else energy + e.square().sum(-1)
        else:
            logits, lses[d], probs[d], qk_sums = _family_attention(
                *rho[:2], e, n, b, tau, left_only, bias, sums_dtype, leaves
            )
            if d == depth - 1 and include_self:
                energy = family_diagonal(logits)
        gates[d], rhos[d] = energy, rho
        if not pools:
            break
        # pooled statistics and energies of the parents, in their node layout [H, F_d, ·]
        total = lses[d] if energy is None else logaddexp(energy, lses[d], **finite)
        parent_energy, pooled, weighted = _pool(
            total, rho, n, counts[d - 1] if d else root_counts, plain, qk_sums, leaves, weighted
        )
        if d == 0:
            return BottomUp(lses, probs, gates, rhos, (parent_energy, pooled))
        rho = [family_layout(t, fanout[d - 1]) for t in pooled]
        energy = family_layout(parent_energy, fanout[d - 1])
        weighted = [family_layout(t, fanout[d - 1]) for t in weighted] if masked else None
    return BottomUp(lses, probs, gates, rhos, None)


def all_finite(counts: list, left_only: bool) -> bool:
    """Whether every ``lse`` and energy of the passes is finite, so that the log-space
    helpers can skip their ``-inf`` cases: all leaves valid (``counts`` are ints: every
    node has leaves) and every node has a sibling key (not ``left_only``, where a first
    child has none)."""
    return isinstance(counts[0], int) and not left_only


def finite_energies(counts: list, include_self: bool) -> bool:
    """Whether every energy of the passes is finite (for finite inputs), so that only
    ``lse`` values can be ``-inf``: with the leaves' self energies every energy above is a
    count-weighted mean of finite totals (children with count 0 weigh 0), and with all
    leaves valid and no self energies every node has a key (the left-only pass needs self
    energies)."""
    return include_self or isinstance(counts[0], int)


def counts_below(weight: Tensor | None, fanout: tuple[int, ...]) -> list:
    """Per depth ``d = 1 … D`` the leaf count of every node: a Python int without a mask
    (equal on a level), else ``[1, F_d, b_d]`` in the accumulation dtype."""
    if weight is None:
        return [math.prod(fanout[d + 1 :]) for d in range(len(fanout))]
    counts, n = [], weight
    for d in range(len(fanout) - 1, -1, -1):
        counts.append(n.view(1, -1, fanout[d]))
        n = n.view(-1, fanout[d]).sum(-1)
    return counts[::-1]


def _family_attention(q, k, e, n, b, tau, left_only, size_bias, sums_dtype=None, tokens=False):
    """The logits ``[H, F, b, b]`` (before the mask and the ``log n`` key bias), ``lse
    [H, F, b]``, the softmax weights ``p [H, F, b, b]`` of one level in family layout and,
    with ``sums_dtype``, the sums ``[H, F, ·]`` of ``q`` and ``k`` over every family
    (:func:`scores`; else ``None``). ``tokens``: ``q, k`` are node-major ``[F, b, H, ·]``
    (:func:`~hiergraph.ops.hsa.token_layout.token_scores`)."""
    logits, *qk_sums = (token_layout.token_scores if tokens else scores)(q, k, tau, sums_dtype)
    if e is not None:
        logits = logits + family_gram(e, e)
    # families of two (no left_only): a node's one key is its sibling, no softmax needed
    pair = b == 2 and not left_only
    if isinstance(n, int):  # all leaves valid: log n(B) is one shift of the level
        if pair:
            lse, p = family.sibling_of_two(logits)
        else:  # b >= 2: without left_only every row keeps a key
            drop = family.left_out(b, left_only, q.device)
            lse, p = softmax_dropping(logits, drop, rows_nonempty=not left_only)
        if size_bias and n > 1:
            lse = lse + math.log(n)
        return logits, lse, p, qk_sums
    biased = logits
    if size_bias:
        biased = logits + torch.log(n.clamp(min=1)).unsqueeze(2).to(logits.dtype)
    if pair:
        return logits, *family.sibling_of_two(biased, n > 0), qk_sums
    drop = family.left_out(b, left_only, q.device) | (n <= 0).unsqueeze(2)
    return logits, *softmax_dropping(biased, drop), qk_sums


def scores(
    q: Tensor, k: Tensor, tau: float, sums_dtype: torch.dtype | None = None
) -> tuple[Tensor, ...]:
    r"""The logits :math:`\tau\, q k^\top` ``[..., b, b]`` of ``q, k [..., b, d]``, and with
    ``sums_dtype`` the sums ``[..., d]`` of ``q`` and of ``k`` over the ``b`` rows, taken in
    that dtype (what the parents' means are made of); a tuple either way.

    Autograd's own backward of ``q @ k.mT`` gives ``k``'s gradient as the transpose of
    :math:`q^\top G`, a strided tensor that the view back to the leaves' layout then
    copies; this backward computes :math:`G^\top q` directly, contiguous. The gradients of
    the sums (one row, broadcast to the ``b`` rows) are the base those two products
    accumulate onto, not a pass of their own over ``q``'s gradient. It is built of
    differentiable operations, so second derivatives work."""
    return _Scores.apply(q, k, tau, sums_dtype)


class _Scores(AutogradFunction):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, tau: float, sums_dtype) -> tuple[Tensor, ...]:
        ctx.save_for_backward(q, k)
        ctx.tau = tau
        ctx.set_materialize_grads(False)
        logits = family_gram(q, k, tau)
        if sums_dtype is None:
            return (logits,)
        return logits, family_sum(q, sums_dtype), family_sum(k, sums_dtype)

    @staticmethod
    def backward(ctx, grad: Tensor | None, *sum_grads: Tensor | None):
        q, k = ctx.saved_tensors
        bases = [None if g is None else g.to(q.dtype).unsqueeze(-2) for g in sum_grads]
        bases += [None] * (2 - len(bases))
        if grad is None:  # only the sums were used
            return *(None if g is None else g.expand_as(q) for g in bases), None, None
        grad = grad * ctx.tau
        return (
            family_product(grad, k, bases[0]),
            family_product(grad.transpose(-1, -2), q, bases[1]),
            None,
            None,
        )


def _pool(
    total: Tensor,
    rho: list[Tensor],
    n,
    parent_n,
    plain: bool,
    qk_sums: list[Tensor],
    tokens: bool = False,
    weighted: list[Tensor] | None = None,
) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    r"""Energies ``a(A) = sum_C n(C)/n(A) log(e^{a(C)} + e^{lse(C)})``, pooled means and
    the sums they are made of, of the parents ``A`` of a level given in family layout;
    ``[H, F]``, ``[H, F, ·]`` and ``[H, F, ·]`` (accumulation dtype).
    ``plain``: the count-weighted sums of the rows are plain sums (all counts equal, or
    the rows with count 0 are zero and the others have count 1); ``qk_sums``: those of
    ``q`` and ``k``, already taken (:func:`scores`), or empty; ``tokens``: ``rho`` is
    node-major ``[F, b, H, ·]`` leaves (counts 1, or 0 and 1 under a mask); ``weighted``:
    the rows' count-weighted sums :math:`n(C) \rho(C)`, when a level below pooled them (a
    masked level: its sums are then summed as they are, with no pass that weighs the means
    again).

    Sums over the ``b`` children are taken in the accumulation dtype, then scaled once
    (the backward of a mean would divide the expanded gradient of every member)."""
    work = accumulation_dtype(total.dtype)
    if isinstance(n, int):
        denom = total.size(-1)
        energy = total.sum(-1, dtype=work) / denom
    else:
        denom = parent_n.reshape(1, -1).clamp(min=1)  # [1, F]
        energy = family.count_weighted_sum(total, family.child_shares(n, denom), work)
        denom = denom.unsqueeze(-1)
    if tokens:  # node-major leaves; under a mask (counts 0 and 1), their valid rows' sums
        leaf_weight = None if plain else n[0]
        sums = qk_sums + [token_layout.token_sum(t, work, leaf_weight) for t in rho[len(qk_sums) :]]
    else:
        if plain:
            weighted = rho
        elif weighted is None:  # masked leaves (counts 0 and 1) whose rows are not zero
            weighted = [t * n.unsqueeze(-1).to(t.dtype) for t in rho]
        sums = qk_sums + [family_sum(t, work) for t in weighted[len(qk_sums) :]]
    pooled = [(s / denom).to(t.dtype) for s, t in zip(sums, rho, strict=True)]
    return energy.to(total.dtype), pooled, sums


def _weighted_sum(parent: Tensor | None, p: Tensor, v: Tensor) -> Tensor:
    """``p @ v`` (``[H, F, b, b] @ [H, F, b, d_v]``) plus, if given, the parents' rows
    ``parent`` (node layout ``[H, F, d_v]``) broadcast to their children."""
    return family_product(p, v, None if parent is None else parent.unsqueeze(2))


def _add(parent: Tensor | None, child: Tensor | None) -> Tensor | None:
    """``parent`` (node layout of the level above, ``[H, F]``) broadcast to its children
    (family layout ``[H, F, b]``) plus ``child``; ``None`` stands for 0."""
    if parent is None:
        return child
    parent = parent.unsqueeze(2)
    return parent if child is None else parent + child
