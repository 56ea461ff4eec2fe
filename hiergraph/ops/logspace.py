"""NaN-safe log-space primitives with explicit conventions for ``-inf``.

Every function here returns exact ``-inf`` where the mathematical value is
:math:`\\log 0`, and never produces NaN in the forward *or* the backward pass
(masked branches are fed safe values before the non-linearity: the
"double where" pattern).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.utils import scatter

from hiergraph._autograd import AutogradFunction
from hiergraph._precision import widened


def masked_softmax(logits: Tensor, mask: Tensor, dim: int = -1) -> tuple[Tensor, Tensor]:
    r"""Softmax and log-partition over the entries where ``mask`` is true.

    .. math::
        \mathrm{lse} = \log \sum_{j:\,m_j} e^{x_j}, \qquad
        a_j = m_j\, e^{x_j - \mathrm{lse}}

    Rows with no unmasked entry get ``lse = -inf`` and all-zero weights. Both outputs
    come from one pass of exponentials (``lse`` and the weights share it), and the backward
    is written out from the weights alone,

    .. math::
        \frac{\partial L}{\partial x_j} = a_j \Big(\frac{\partial L}{\partial a_j}
        - \sum_k a_k \frac{\partial L}{\partial a_k}
        + \frac{\partial L}{\partial \mathrm{lse}}\Big),

    in differentiable operations (second derivatives work); masked entries get zero
    gradient.

    Args:
        logits: any shape.
        mask: bool, broadcastable to ``logits``.
        dim: the reduction dimension.

    Returns:
        ``(lse, weights)`` with ``lse`` reduced over ``dim`` (dimension
        removed) and ``weights`` shaped like ``logits``, in the logits' dtype: bfloat16 and
        float16 logits are computed in float32 and both outputs rounded once (as
        :func:`torch.softmax` computes them).
    """
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got dtype {mask.dtype}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be floating-point, got dtype {logits.dtype}")
    try:
        fits = torch.broadcast_shapes(logits.shape, mask.shape) == logits.shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"mask {tuple(mask.shape)} must broadcast to the logits' shape {tuple(logits.shape)}"
        )
    (wide,) = widened(logits)
    lse, weights = softmax_dropping(wide, ~mask, dim)
    return lse.to(logits.dtype), weights.to(logits.dtype)


def softmax_dropping(
    logits: Tensor, drop: Tensor, dim: int = -1, *, rows_nonempty: bool = False
) -> tuple[Tensor, Tensor]:
    """:func:`masked_softmax` given the complement of the mask, ``drop`` (``True`` = left
    out), for callers that build it directly. ``rows_nonempty=True`` promises that every row
    keeps an entry, which skips the guards for empty rows (two operations fewer; an empty
    row then gives NaN)."""
    return _MaskedSoftmax.apply(logits, drop, dim, rows_nonempty)


class _MaskedSoftmax(AutogradFunction):
    @staticmethod
    def forward(
        ctx, logits: Tensor, drop: Tensor, dim: int, rows_nonempty: bool
    ) -> tuple[Tensor, Tensor]:
        x = logits.masked_fill(drop, float("-inf"))  # a scalar: no host-to-device copy
        lse, p = softmax_(x, dim, rows_nonempty=rows_nonempty)
        ctx.dim = dim
        ctx.save_for_backward(p)
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None
        return lse, p

    @staticmethod
    def backward(ctx, grad_lse: Tensor | None, grad_p: Tensor | None):
        (p,) = ctx.saved_tensors
        dim = ctx.dim
        if grad_p is None and grad_lse is None:
            return None, None, None, None
        if grad_p is None:
            shift = grad_lse.unsqueeze(dim)
        else:
            shift = grad_p - (grad_p * p).sum(dim=dim, keepdim=True)
            if grad_lse is not None:
                shift = shift + grad_lse.unsqueeze(dim)
        return p * shift, None, None, None


def softmax_(x: Tensor, dim: int = -1, *, rows_nonempty: bool = False) -> tuple[Tensor, Tensor]:
    """``(lse, weights)`` of the logits ``x`` whose left-out entries are ``-inf`` already,
    the weights written over ``x`` (no autograd: the forward of :func:`softmax_dropping`, and
    of ops with a written-out backward). ``rows_nonempty`` as there; off the CPU it runs as
    :func:`softmax_kernels`, whose weights are new memory."""
    if x.size(dim) == 0:  # no entries at all (e.g. no keys): every row is empty
        return x.sum(dim).fill_(float("-inf")), x
    if x.device.type != "cpu":
        return softmax_kernels(x, dim, rows_nonempty=rows_nonempty)
    m = x.amax(dim=dim, keepdim=True)
    if not rows_nonempty:
        m = m.masked_fill(m == float("-inf"), 0.0)  # rows with no entry: e = 0 below
    e = x.sub_(m).exp_()
    s = e.sum(dim=dim, keepdim=True)
    # a row with an entry has s >= 1 (its maximum adds e^0); an empty row has s = 0, so
    # log s = -inf there and e / max(s, 1) = 0
    p = e.div_(s if rows_nonempty else s.clamp(min=1.0))
    return s.log_().add_(m).squeeze(dim), p


def softmax_kernels(
    x: Tensor, dim: int = -1, *, rows_nonempty: bool = True
) -> tuple[Tensor, Tensor]:
    """``(lse, weights)`` of the logits ``x`` as PyTorch's fused ``logsumexp`` and
    ``softmax`` (the weights in new memory): two dispatched operations and about half the
    passes over ``x`` of :func:`softmax_`'s eight to eleven element-wise ones, which are
    faster on the CPU (2–5× there for families of 2 to 16). Unless ``rows_nonempty``, a row
    without an entry (``lse = -inf``, where ``softmax`` gives NaN) weighs 0: two more."""
    lse, weights = torch.logsumexp(x, dim), torch.softmax(x, dim)
    if not rows_nonempty:
        weights = weights.masked_fill_(lse.unsqueeze(dim) == float("-inf"), 0.0)
    return lse, weights


def scatter_softmax(logits: Tensor, index: Tensor, num_rows: int) -> tuple[Tensor, Tensor]:
    r"""Softmax and log-partition of the entries grouped by row: the edge-list
    counterpart of :func:`masked_softmax`.

    .. math::
        \mathrm{lse}_i = \log \sum_{e:\,\mathrm{index}_e = i} e^{x_e}, \qquad
        a_e = e^{x_e - \mathrm{lse}_{\mathrm{index}_e}}

    Entries are left out by giving them the logit ``-inf`` (e.g.
    ``logits.masked_fill(~mask, float("-inf"))``). Rows whose entries are all ``-inf``
    get ``lse = -inf``, and their entries weight 0; a NaN logit makes its row's ``lse``
    and weights NaN. The shift is the detached row maximum, so the backward of finite
    logits is NaN-free. Row sums are accumulated with
    ``index_add`` in entry order, so a row's values never depend on the other
    rows' entries.

    Args:
        logits: ``[E, ...]`` one logit per entry (e.g. ``[E, H]``).
        index: ``[E]`` row of each entry, in ``0 .. num_rows - 1``.
        num_rows: number of rows ``R``.

    Returns:
        ``(lse [R, ...], weights [E, ...])``.
    """
    m = scatter(logits.detach(), index, 0, num_rows, "max")
    m = m.masked_fill(~torch.isfinite(m), 0.0)
    e = torch.exp(logits - m[index])
    total = e.new_zeros((num_rows, *e.shape[1:])).index_add(0, index, e)
    empty = total == 0  # not ~(total > 0): a NaN sum is no empty row, its NaN stays
    safe = total.masked_fill(empty, 1.0)
    lse = (m + torch.log(safe)).masked_fill(empty, float("-inf"))
    return lse, e / safe.index_select(0, index)


def logaddexp(a: Tensor, b: Tensor, finite: bool = False, *, finite_a: bool = False) -> Tensor:
    r"""``log(exp(a) + exp(b))``, exactly ``b`` where ``a = -inf`` (and ``a`` where ``b = -inf``).

    The ``-inf`` cases bypass :func:`torch.logaddexp`, whose backward there is
    ``1 / (1 + exp(inf))``: zero, but its own derivative is ``inf / inf``. So the first
    *and* second derivatives are NaN-free; both ``-inf`` gives ``-inf`` with zero gradient.

    Args:
        a, b: log-values, broadcastable to one shape; ``-inf`` stands for :math:`\log 0`.
        finite: the caller guarantees finite ``a`` and ``b``, which need none of this: plain
            :func:`torch.logaddexp` (one kernel instead of ten). Takes precedence over
            ``finite_a``.
        finite_a: the caller guarantees finite ``a``; ``b`` may be ``-inf``:
            :math:`a - \log\sigma(a - b)` (three kernels), whose log-sigmoid has first
            and second derivatives 0 or 1 at :math:`\pm\infty`.

    Returns:
        ``log(exp(a) + exp(b))``, with the broadcast shape of ``a`` and ``b``.
    """
    if finite:
        return torch.logaddexp(a, b)
    if finite_a:
        return a - F.logsigmoid(a - b)
    a_inf, b_inf = torch.isneginf(a), torch.isneginf(b)
    either = a_inf | b_inf
    zero = torch.zeros((), dtype=a.dtype, device=a.device)
    out = torch.logaddexp(torch.where(either, zero, a), torch.where(either, zero, b))
    out = torch.where(a_inf, b, torch.where(b_inf, a, out))
    return torch.where(a_inf & b_inf, torch.full_like(out, float("-inf")), out)


def log_gates(a: Tensor, b: Tensor, finite: bool = False) -> tuple[Tensor, Tensor]:
    r"""Log of the gate :math:`\mu = e^a / (e^a + e^b)` and of :math:`1 - \mu`.

    Conventions for infinite arguments (``a`` and ``b`` are never ``+inf``):
    ``a = -inf`` gives :math:`(\log\mu, \log(1-\mu)) = (-\infty, 0)`;
    ``b = -inf`` gives :math:`(0, -\infty)`; both give :math:`(-\infty, -\infty)`
    (no mass anywhere).

    Args:
        a, b: log-weights of the two sides, broadcastable to one shape, never ``+inf``.
        finite: the caller guarantees that ``a`` or ``b`` is finite at every position
            (plain log-sigmoids, which give those values for one infinite argument, with
            first and second derivatives 0 or 1 there).

    Returns:
        ``(log_mu, log_one_minus_mu)``, each with the broadcast shape of ``a`` and ``b``.
    """
    if finite:
        return F.logsigmoid(a - b), F.logsigmoid(b - a)
    # one argument -inf: a - b = -/+inf, whose log-sigmoids are the conventions' values (with
    # derivatives 0 or 1); both -inf: a - b = NaN, replaced before the log-sigmoids
    none = torch.isneginf(a) & torch.isneginf(b)
    diff = (a - b).masked_fill(none, 0.0)
    neg_inf = float("-inf")
    log_mu = F.logsigmoid(diff).masked_fill(none, neg_inf)
    return log_mu, F.logsigmoid(-diff).masked_fill(none, neg_inf)
