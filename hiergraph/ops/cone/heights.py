r"""Height of the lowest common ancestor :math:`\sup_2(u, v)` of two points of the
half-space, from the three numbers that matter, ``(D, u_d, v_d)``:
:func:`penumbral_lca_height` and :func:`umbral_lca_height` (elementwise, broadcasting),
with their hand-written backward (:class:`_LCAHeight`: the partial derivatives are formed
in the forward pass), and the dtype that cone scores and heights are computed in
(:func:`compute_dtype`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

from hiergraph._autograd import AutogradFunction, differentiable_once, records_grad
from hiergraph._checks import check_positive

HeightFn = Callable[[Tensor, Tensor, Tensor], Tensor]


def compute_dtype(*tensors: Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32 (half precision is promoted); read
    from the dtypes alone (``torch.promote_types`` would dispatch an operation per input)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _step(x: Tensor) -> Tensor:
    """Heaviside step, 1/2 at 0, by arithmetic: ``torch.where`` and comparisons are an
    order of magnitude slower than ``sign`` on CPU."""
    return torch.sign(x).mul_(0.5).add_(0.5)


Partials = tuple[Tensor, Tensor, Tensor] | None


def _expand_dist(dist: Tensor, y_u: Tensor, y_v: Tensor) -> Tensor:
    """``dist`` expanded to the broadcast shape, so every tensor derived from it is full-size."""
    return dist.expand(torch.broadcast_shapes(dist.shape, y_u.shape, y_v.shape))


def _penumbral_h2(
    dist: Tensor, y_u: Tensor, y_v: Tensor, r: float, with_partials: bool
) -> tuple[Tensor, Partials]:
    """:math:`H^2` of :func:`penumbral_lca_height` and, optionally, its partial
    derivatives in ``(D, u_d, v_d)``, all with the broadcast shape.

    Branch-free: the in-cone branch is evaluated at ``min(D, s_u + s_v)`` and the
    out-of-cone branch at ``max(D, s_u + s_v)`` (so neither divides by 0), then
    blended with a 0/1 step, which is exact because both equal ``r^2`` on the
    boundary. ``D`` saturates at ``sqrt(finfo.max)`` (about ``1.8e19`` in float32), so
    that :math:`H^2 \approx D^2 / 4` stays finite. In-place operations only touch tensors
    derived from ``dist`` (expanded to the full broadcast shape), never the inputs.
    """
    tiny = torch.finfo(dist.dtype).eps ** 2
    dist = _expand_dist(dist, y_u, y_v)
    a2, b2 = y_u * y_u, y_v * y_v
    s2_u, s2_v = (r - y_u).mul_(r + y_u), (r - y_v).mul_(r + y_v)  # r^2 - y^2, no cancellation
    s_u, s_v = s2_u.clamp_min(tiny).sqrt_(), s2_v.clamp_min(tiny).sqrt_()
    span = s_u + s_v  # a common cone exists iff D < span (eq. 23)
    d_in = torch.minimum(dist, span)
    gap = span - d_in
    # r^2 - gap^2/4 = (2r - gap)(2r + gap)/4, with 2r - gap = D + sum y^2/(r + s) (no cancellation)
    third = (gap + 2 * r).mul_((d_in + a2 / (r + s_u)).add_(b2 / (r + s_v))).mul_(0.25)
    top = torch.maximum(a2, b2)
    h2_in = torch.maximum(top, third)
    # beyond sqrt(max), H^2 ~ D^2 / 4 would overflow: D saturates (H flat there, slope 0)
    far = math.sqrt(torch.finfo(dist.dtype).max)
    d_out = torch.clamp(dist, span, dist.new_full((), far))  # (one pass, as maximum alone)
    centre = ((a2 - b2) / d_out).add_(d_out).mul_(0.5)  # geodesic centre offset from v
    h2_out = torch.addcmul(b2, centre, centre)
    outside = _step(dist - span)
    h2 = torch.lerp(h2_in, h2_out, outside)
    if not with_partials:
        return h2, None

    # in cone: max(u_d^2, v_d^2, third); d third/dD = -d third/d span = gap / 2
    w_third = _step(third.sub_(top))
    w_top = 1 - w_third
    w_u = w_top * _step(y_u - y_v)
    w_v = w_top.sub_(w_u)
    half_gap = gap.mul_(w_third).mul_(0.5)
    ds_u = y_u / s_u * _step(s2_u - tiny)  # -d s_u / d u_d; 0 where the floor is active
    ds_v = y_v / s_v * _step(s2_v - tiny)
    du = torch.addcmul(half_gap * ds_u, w_u, y_u, value=2)
    dv = torch.addcmul(half_gap * ds_v, w_v, y_v, value=2)
    # out of cone: centre^2 + v_d^2 with centre = D/2 + (u_d^2 - v_d^2) / (2D)
    two_c = (centre / d_out).mul_(2)
    rest = 2 - two_c
    partials = (
        half_gap.lerp_(torch.where(dist < far, centre.mul_(rest), 0.0), outside),
        du.lerp_(two_c.mul_(y_u), outside),
        dv.lerp_(rest.mul_(y_v), outside),
    )
    return h2, partials


def _penumbral_h(
    dist: Tensor, y_u: Tensor, y_v: Tensor, r: float, squared: bool, with_partials: bool
) -> tuple[Tensor, Partials]:
    """:math:`H` (or :math:`H^2`) and optional partials; see :func:`_penumbral_h2`."""
    h2, partials = _penumbral_h2(dist, y_u, y_v, r, with_partials)
    if squared:
        return h2, partials
    tiny = torch.finfo(dist.dtype).eps ** 2
    h = h2.clamp_min(tiny).sqrt_()
    if partials is None:
        return h, None
    factor = _step(h2.sub_(tiny)).div_(h).mul_(0.5)  # dH / dH^2; 0 where H^2 is floored
    return h, tuple(p.mul_(factor) for p in partials)


def _umbral_h(
    dist: Tensor, y_u: Tensor, y_v: Tensor, slope: float, with_partials: bool
) -> tuple[Tensor, Partials]:
    """:math:`H` of :func:`umbral_lca_height` and optional partials in ``(D, u_d, v_d)``."""
    dist = _expand_dist(dist, y_u, y_v)
    top = torch.maximum(y_u, y_v)
    apex = (dist * slope).add_(y_u + y_v, alpha=0.5)
    h = torch.maximum(top, apex)
    if not with_partials:
        return h, None
    w_apex = _step(apex.sub_(top))
    du = ((1 - w_apex) * _step(y_u - y_v)).add_(w_apex, alpha=0.5)
    return h, (w_apex.mul_(slope), du, 1 - du)


class _LCAHeight(AutogradFunction):
    """``scale * H(D, u_d, v_d)`` with the partial derivatives formed in the forward pass.

    Autograd through ``where``/``maximum`` records ~10 slow mask operations per
    element on CPU; here the forward computes the three partials with in-place
    arithmetic and the backward is three products. Ties in a max split the
    gradient evenly, as ``torch.maximum`` does.
    """

    @staticmethod
    def forward(ctx, dist: Tensor, y_u: Tensor, y_v: Tensor, height_fn: Callable, scale: float):
        h, partials = height_fn(dist, y_u, y_v, with_partials=True)
        ctx.save_for_backward(*partials)
        ctx.shapes = (dist.shape, y_u.shape, y_v.shape)
        ctx.scale = scale
        return h.mul_(scale) if scale != 1.0 else h

    @staticmethod
    @differentiable_once
    def backward(ctx, grad: Tensor):
        grad = grad * ctx.scale if ctx.scale != 1.0 else grad
        grads = [
            (grad * partial).sum_to_size(shape) if needed else None
            for partial, shape, needed in zip(
                ctx.saved_tensors, ctx.shapes, ctx.needs_input_grad, strict=False
            )
        ]
        return *grads, None, None


def _height_dtype(dist: Tensor, y_u: Tensor, y_v: Tensor) -> torch.dtype:
    """The dtype an LCA height is computed in: the inputs' when they share one, else
    :func:`compute_dtype`'s."""
    dtypes = {t.dtype for t in (dist, y_u, y_v)}
    return dtypes.pop() if len(dtypes) == 1 else compute_dtype(dist, y_u, y_v)


def _lca_height(height_fn: Callable, dist: Tensor, y_u: Tensor, y_v: Tensor, scale):
    """``scale * H``: through :class:`_LCAHeight` when a gradient is needed, else directly.
    A tensor ``scale`` (a learned temperature) multiplies the result, so that it gets its
    gradient and its value is never read on the host."""
    if isinstance(scale, Tensor):
        return _lca_height(height_fn, dist, y_u, y_v, 1.0) * scale
    if records_grad(dist, y_u, y_v):
        return _LCAHeight.apply(dist, y_u, y_v, height_fn, float(scale))
    h, _ = height_fn(dist, y_u, y_v, with_partials=False)
    return h.mul_(scale) if scale != 1.0 else h


def penumbral_lca_height(
    dist: Tensor,
    y_u: Tensor,
    y_v: Tensor,
    r: float = 1.0,
    squared: bool = False,
    scale: float = 1.0,
) -> Tensor:
    r"""Height of :math:`\sup_2(u, v)` for penumbral cones (paper Def. 1, eqs. 21-23).

    With :math:`s_u = \sqrt{r^2 - u_d^2}`, :math:`s_v = \sqrt{r^2 - v_d^2}`:

    .. math::
        H^2 = \begin{cases}
            \max\!\big(u_d^2,\ v_d^2,\ r^2 - \tfrac14 (s_u + s_v - D)^2\big)
                & D < s_u + s_v \ \text{(a common cone exists)} \\
            \Big(\dfrac{D^2 + u_d^2 - v_d^2}{2D}\Big)^2 + v_d^2 & \text{otherwise.}
        \end{cases}

    ``D < s_u + s_v`` is the symmetric form of the paper's eq. 23 (the main
    text's eq. 7 drops a clause). Both branches equal ``r`` on the boundary. ``D`` saturates
    at ``sqrt(finfo.max)`` (about ``1.8e19`` in float32), where :math:`H^2` would overflow:
    beyond it the height is constant and its slope in ``D`` is 0.
    :math:`s` is floored at float eps (with zero gradient there), so heights at
    the light source stay finite. Differentiable once (hand-written backward;
    ties in a max split the gradient evenly, as ``torch.maximum`` does).

    Args:
        dist: horizontal distances ``D >= 0``; any shape broadcastable with the heights.
        y_u, y_v: heights in ``(0, r)``.
        r: light-source height.
        squared: return :math:`H^2` (authors' code) instead of :math:`H` (paper).
        scale: multiply the result by this inside the fused op (scores use :math:`-\gamma`).

    Returns:
        ``scale * H`` (or ``scale * H**2``) with the broadcast shape of the inputs.

    Raises:
        ValueError: unless ``r`` is a finite number > 0 for which :math:`(2r)^2` stays finite
            in the dtype the heights are computed in, that of the inputs (float32: ``r``
            below about 9e18; float16: below 128), where heights near ``r`` would be NaN.
    """
    check_positive(r, "r")
    dtype = _height_dtype(dist, y_u, y_v)
    limit = math.sqrt(torch.finfo(dtype).max) / 2
    if not float(r) < limit:
        raise ValueError(
            f"r = {float(r):g} is too large for {dtype}: (2r)^2 overflows and heights near "
            f"r would be NaN; use r < {limit:.3g} (or wider inputs)"
        )
    height_fn = partial(_penumbral_h, r=float(r), squared=squared)
    return _lca_height(height_fn, dist, y_u, y_v, scale)


def umbral_lca_height(
    dist: Tensor, y_u: Tensor, y_v: Tensor, r: float = 0.1, scale: float = 1.0
) -> Tensor:
    r"""Height of :math:`\sup_2(u, v)` for umbral cones of ball radius ``r`` (paper eq. 38).

    .. math::
        H = \max\!\Big(u_d,\ v_d,\ \frac{D}{2\sinh r} + \frac{u_d + v_d}{2}\Big)

    Differentiable once (hand-written backward; ties split the gradient evenly).

    Args:
        dist: horizontal distances ``D >= 0``, broadcastable with the heights.
        y_u, y_v: heights ``> 0``.
        r: hyperbolic radius of the ball around each point (0.1 in the paper's runs).
        scale: multiply the result by this inside the fused op.

    Raises:
        ValueError: unless ``r`` is a finite number > 0 for which the slope
            :math:`1 / (2 \sinh r)` is finite in the dtype the heights are computed in
            (float32: ``r`` from about 1.5e-39 on), where :math:`D = 0` would give NaN.
    """
    check_positive(r, "r")
    # 1 / (2 sinh r) = e^-r / (1 - e^-2r): no overflow for a large radius
    slope = math.exp(-r) / -math.expm1(-2 * r)
    dtype = _height_dtype(dist, y_u, y_v)
    if not slope <= torch.finfo(dtype).max:
        raise ValueError(
            f"r = {float(r):g} is too small for {dtype}: 1 / (2 sinh r) overflows and "
            f"self-pairs (D = 0) would be NaN; use r >= {1 / (2 * torch.finfo(dtype).max):.3g} "
            f"(or wider inputs)"
        )
    height_fn = partial(_umbral_h, slope=slope)
    return _lca_height(height_fn, dist, y_u, y_v, scale)
