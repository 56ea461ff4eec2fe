r"""Cone attention scores: penumbral and umbral (Tseng et al., "Coneheads", NeurIPS 2023).

A score between a query ``q`` and a key ``k`` is minus the Euclidean height of
the lowest common ancestor :math:`\sup_2(u, v)` of their images ``u``, ``v`` in
the Poincaré half-space :math:`\{x \in \mathbb{R}^d : x_d > 0\}`:

.. math::
    s(q, k) = -\gamma \, H(u, v), \qquad u = \mathrm{map}(q),\ v = \mathrm{map}(k).

A deeper (lower) common ancestor gives a larger score; the softmax over keys is
left to the caller, as for dot-product logits. Only three numbers per pair
matter (Theorem 2 of the paper): the horizontal distance
:math:`D = \lVert u_{:-1} - v_{:-1} \rVert` and the heights :math:`u_d, v_d`.

Layout of this module:

* maps to the half-space: :func:`xi_map` (sigmoid, penumbral) and :func:`psi_map`
  (exp, umbral); each returns ``(horizontal [..., d-1], height [...])``;
* LCA heights from ``(D, u_d, v_d)``: :func:`penumbral_lca_height`,
  :func:`umbral_lca_height` (elementwise, broadcasting);
* per-edge inputs of a height: :func:`edge_pairs` ``(D, u_d, v_d)`` and
  :func:`edge_distance`;
* scores on raw Euclidean vectors, dense ``[..., n, m]``: :func:`penumbral`,
  :func:`umbral`; and per ``edge_index`` column ``[E, ...]``:
  :func:`penumbral_edge`, :func:`umbral_edge`.

Conventions where the paper and the authors' code differ (defaults follow the
paper's equations; the reference-code setting is one argument away):

=====================  ===========================  ===============================
choice                 default (paper)              authors' code
=====================  ===========================  ===============================
penumbral score        :math:`-\gamma H`            ``squared=True``: :math:`-\gamma H^2`
umbral map height      :math:`e^{x_d}`              ``height_scale=None``: :math:`e^{x_d/d}`
umbral radius ``r``    0.1 (the paper's runs)       1.0 (code default): pass ``r=1.0``
=====================  ===========================  ===============================

The paper's ξ (sigmoid) is called ``map_psi`` in the authors' code and its ψ
(exp) is called ``map_xi``; names here follow the paper.

Numerics: every function computes in float32 or wider, with autocast disabled
(half-precision overflows in the out-of-cone branch), and is finite in the
forward and backward pass at ``D = 0`` (``q == k``, self loops), at heights next
to the light source, and for large inputs, up to where intermediate values overflow
the dtype. Penumbral heights saturate at a horizontal distance ``D`` of
``sqrt(finfo.max)`` (about ``1.8e19`` in float32, where a norm of coordinates overflows
too), so scores and gradients stay finite for float32 inputs up to about ``1e38`` (such a
pair gets a weight of 0 beside any ordinary one; saturated pairs tie); umbral scores that
pass float32's range round to ``-inf`` (a weight of 0; with the default map, from inputs of
about ``1e11`` on), never NaN: the ψ map's horizontal coordinates saturate at
``finfo.max / 2``, and a point's score with itself stays finite. Float64 goes far beyond
either.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from hiergraph._autograd import AutogradFunction, records_grad
from hiergraph._checks import check_positive
from hiergraph.ops.edge_index import check_edge_index

#: Upper clamp on the log-height of :func:`psi_map`; ``exp(20) ~ 4.9e8`` keeps
#: squared horizontal distances far from float32 overflow.
MAX_LOG_HEIGHT = 20.0

#: The paper's experimental setting: penumbral light source at height 1, umbral radius 0.1.
DEFAULT_RADIUS = {"penumbral": 1.0, "umbral": 0.1}

HalfSpaceMap = Callable[[Tensor], tuple[Tensor, Tensor]]
HeightFn = Callable[[Tensor, Tensor, Tensor], Tensor]


def _check_points(name: str, x: Tensor) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() < 2 or x.size(-1) < 2:
        raise ValueError(
            f"{name} must be [..., n, d]: points along dim -2 and a last (feature) "
            f"dimension of size d >= 2 (d-1 horizontal coordinates plus one height), got "
            f"shape {tuple(x.shape)}"
        )


def _compute_dtype(*tensors: Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32 (half precision is promoted); read
    from the dtypes alone (``torch.promote_types`` would dispatch an operation per input)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


# ---------------------------------------------------------------------------
# Maps from R^d to the Poincaré half-space
# ---------------------------------------------------------------------------


def xi_map(x: Tensor, r: float = 1.0) -> tuple[Tensor, Tensor]:
    r"""The paper's ξ map (eq. 11) onto the half-space below a light source at height ``r``.

    .. math::
        \xi(x)_d = r\,\sigma(x_d) \in (0, r), \qquad \xi(x)_{:-1} = x_{:-1}\, \xi(x)_d.

    Args:
        x: ``[..., d]`` with ``d >= 2``; the last coordinate becomes the height.
        r: light-source height (the paper's ``h``; 1 in its experiments).

    Returns:
        ``(horizontal [..., d-1], height [...])``.
    """
    height = r * torch.sigmoid(x[..., -1])
    return x[..., :-1] * height.unsqueeze(-1), height


def psi_map(
    x: Tensor, height_scale: float | None = 1.0, max_log_height: float = MAX_LOG_HEIGHT
) -> tuple[Tensor, Tensor]:
    r"""The paper's ψ map (eq. 10) onto the half-space, with an optional height temperature.

    .. math::
        \psi(x)_d = \exp\!\big(\min(c\,x_d,\ L)\big) > 0, \qquad
        \psi(x)_{:-1} = x_{:-1}\, \psi(x)_d,

    with ``c = height_scale`` (paper: 1; ``None`` means ``1/d``, as in the authors' code) and
    ``L = max_log_height`` guarding float32 overflow. Horizontal coordinates saturate at
    ``±finfo.max / 2``, so that differences of two of them are finite (an overflow to
    infinity made the distance of a point to itself ``inf - inf``, NaN): a point that far
    lies at an infinite distance from the others, not at none.

    Args:
        x: ``[..., d]`` with ``d >= 2``.

    Returns:
        ``(horizontal [..., d-1], height [...])``.
    """
    c = 1.0 / x.size(-1) if height_scale is None else height_scale
    height = torch.exp((c * x[..., -1]).clamp_max(max_log_height))
    limit = torch.finfo(height.dtype).max / 2
    return (x[..., :-1] * height.unsqueeze(-1)).clamp(-limit, limit), height


# ---------------------------------------------------------------------------
# Height of the lowest common ancestor, from (D, u_d, v_d)
# ---------------------------------------------------------------------------


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
    @once_differentiable
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
    :func:`_compute_dtype`'s."""
    dtypes = {t.dtype for t in (dist, y_u, y_v)}
    return dtypes.pop() if len(dtypes) == 1 else _compute_dtype(dist, y_u, y_v)


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


# ---------------------------------------------------------------------------
# Scores on raw vectors: dense and edge forms
# ---------------------------------------------------------------------------


def _dense_pairs(u: tuple[Tensor, Tensor], v: tuple[Tensor, Tensor]):
    """All pairs: ``D [..., n, m]``, ``u_d [..., n, 1]``, ``v_d [..., 1, m]``.

    ``D`` from coordinate differences, never from ``|u|^2 + |v|^2 - 2 u.v``
    (which ``cdist`` would use above 25 rows and which cancels to ~1e-2 where
    ``D = 0``): the dense scores equal the edge scores, self-pairs included.
    """
    (ux, uy), (vx, vy) = u, v
    dist = torch.cdist(ux, vx, compute_mode="donot_use_mm_for_euclid_dist")
    return dist, uy.unsqueeze(-1), vy.unsqueeze(-2)


class _EdgeGeometry(AutogradFunction):
    """Per-edge ``(D, u_d, v_d)`` from packed node points ``[N, ..., d]`` whose last
    channel is the height and whose first ``d - 1`` channels are horizontal.

    One ``index_select`` per endpoint gathers both the horizontal coordinates and
    the height, and the backward scatters both with one ``index_add_`` per
    endpoint (into one buffer when the two point sets are the same tensor, as
    for shared queries and keys): on CPU these calls cost about as much for
    ``[E, H]`` as for ``[E, H, d]`` rows. The horizontal sum of squares is a
    matrix-vector product with weights ``(1, ..., 1, 0)``, several times faster
    than a reduction over a short last dimension. The subgradient of ``D`` at
    ``D = 0`` is 0, as for ``torch.linalg.vector_norm``.
    """

    @staticmethod
    def forward(ctx, p_dst: Tensor, p_src: Tensor, dst: Tensor, src: Tensor):
        diff = p_dst.index_select(0, dst)
        gathered_src = p_src.index_select(0, src)
        # clone, not contiguous(): for one edge and one head the height column is already
        # contiguous, and contiguous() would return a view that sub_ below overwrites
        y_dst, y_src = diff[..., -1].clone(), gathered_src[..., -1].contiguous()
        diff.sub_(gathered_src)
        channels = diff.size(-1)
        # 1 for the space channels, 0 for the height: built on the device (no host copy)
        weights = (torch.arange(channels, device=diff.device) < channels - 1).to(diff.dtype)
        squares = diff.square().view(-1, channels)
        dist = torch.mv(squares, weights).sqrt_().view(diff.shape[:-1])
        ctx.save_for_backward(diff, dist, dst, src)
        ctx.num_nodes = (p_dst.size(0), p_src.size(0))
        ctx.same_input = p_dst is p_src
        return dist, y_dst, y_src

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_dist: Tensor, grad_y_dst: Tensor, grad_y_src: Tensor):
        diff, dist, dst, src = ctx.saved_tensors
        scale = grad_dist * dist.sign() / dist.clamp_min(torch.finfo(dist.dtype).tiny)
        grad = diff * scale.unsqueeze(-1)  # dD / d(target points); height channel set below
        grad[..., -1] = grad_y_dst
        need_dst, need_src = ctx.needs_input_grad[:2]
        out_dst = out_src = None
        if need_dst:
            out_dst = grad.new_zeros(ctx.num_nodes[0], *grad.shape[1:]).index_add_(0, dst, grad)
        if need_src or ctx.same_input:
            grad.neg_()  # dD / d(source points) = -dD / d(target points)
            grad[..., -1] = grad_y_src
            if ctx.same_input:
                return out_dst.index_add_(0, src, grad), None, None, None
            out_src = grad.new_zeros(ctx.num_nodes[1], *grad.shape[1:]).index_add_(0, src, grad)
        return out_dst, out_src, None, None


def _pack(points: tuple[Tensor, Tensor]) -> Tensor:
    """``(horizontal [..., d-1], height [...])`` -> ``[..., d]`` with the height last."""
    horizontal, height = points
    return torch.cat([horizontal, height.unsqueeze(-1)], dim=-1)


def edge_pairs(
    u: tuple[Tensor, Tensor], v: tuple[Tensor, Tensor], edge_index: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    r"""What an LCA height needs, for every edge ``j -> i``:
    :math:`D = \lVert u_{i,:-1} - v_{j,:-1} \rVert`, :math:`u_{i,d}` and :math:`v_{j,d}`.

    Args:
        u: target-node points ``(horizontal [N_dst, ..., d-1], height [N_dst, ...])``,
            as returned by :func:`xi_map` / :func:`psi_map`.
        v: source-node points, same layout. Pass the same object as ``u`` for
            shared queries and keys: the backward then fills one buffer.
        edge_index: ``[2, E]``, row 0 = source ``j``, row 1 = target ``i``.

    Returns:
        ``(D, u_d, v_d)``, each ``[E, ...]``. Differentiable once.
    """
    packed_u = _pack(u)
    packed_v = packed_u if v is u else _pack(v)
    return _EdgeGeometry.apply(packed_u, packed_v, edge_index[1], edge_index[0])


def edge_distance(x_dst: Tensor, x_src: Tensor, edge_index: Tensor) -> Tensor:
    r"""Euclidean distance of every edge ``j -> i``: :math:`\lVert x^{dst}_i - x^{src}_j \rVert`.

    Equal to ``torch.linalg.vector_norm(x_dst[i] - x_src[j], dim=-1)`` (same zero
    subgradient at distance 0), with a cheaper backward. Differentiable once.

    Args:
        x_dst: target-node points ``[N_dst, ..., c]``.
        x_src: source-node points ``[N_src, ..., c]`` (same trailing shape).
        edge_index: ``[2, E]``, row 0 = source ``j``, row 1 = target ``i``.

    Returns:
        Distances ``[E, ...]``.
    """
    u = (x_dst, x_dst.new_zeros(x_dst.shape[:-1]))  # a zero height channel, not used by D
    v = u if x_src is x_dst else (x_src, x_src.new_zeros(x_src.shape[:-1]))
    return edge_pairs(u, v, edge_index)[0]


def _check_edges(q: Tensor, k: Tensor, edge_index: Tensor) -> None:
    if q.dim() < 2 or k.dim() < 2:
        raise ValueError(
            f"q [N_dst, ..., d] and k [N_src, ..., d] need a node and a feature dimension, "
            f"got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    if q.shape[1:] != k.shape[1:]:
        raise ValueError(
            f"q [N_dst, ..., d] and k [N_src, ..., d] must agree after the node dimension, "
            f"got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    # the shared check: ids read on the host for CPU tensors only, a device-side
    # assertion on an accelerator (no host sync)
    check_edge_index(edge_index, k.size(0), q.size(0))


def _cone_scores(
    q: Tensor,
    k: Tensor,
    to_halfspace: HalfSpaceMap,
    lca_height: HeightFn,
    gamma: float,
    pairs: Callable,
) -> Tensor:
    """``-gamma * H(map(q), map(k))`` over the pairs chosen by ``pairs``, in float32 or wider.

    ``pairs(u, v) -> (D, u_d, v_d)`` takes the mapped points ``(horizontal, height)``.
    """
    _check_points("q", q)
    _check_points("k", k)
    if q.size(-1) != k.size(-1):
        raise ValueError(
            f"q and k must have the same feature size, got {q.size(-1)} and {k.size(-1)}"
        )
    check_positive(gamma, "gamma")
    dtype = _compute_dtype(q, k)
    with torch.autocast(device_type=q.device.type, enabled=False):
        u, v = to_halfspace(q.to(dtype)), to_halfspace(k.to(dtype))
        return lca_height(*pairs(u, v), scale=-gamma)


def cone_geometry(
    variant: str,
    r: float | None = None,
    squared: bool = False,
    height_scale: float | None = 1.0,
) -> tuple[HalfSpaceMap, HeightFn]:
    """The ``(map, lca_height)`` pair of a variant, with its parameters bound.

    Args:
        variant: ``"penumbral"`` (ξ map, :func:`penumbral_lca_height`) or
            ``"umbral"`` (ψ map, :func:`umbral_lca_height`).
        r: light-source height (penumbral) or ball radius (umbral); ``None``
            takes the paper's value from :data:`DEFAULT_RADIUS`.
        squared: penumbral only, see :func:`penumbral_lca_height`.
        height_scale: umbral only, see :func:`psi_map`.

    Returns:
        ``to_halfspace(x [..., d]) -> (horizontal, height)`` and
        ``lca_height(D, u_d, v_d) -> H``; both picklable.
    """
    if variant not in DEFAULT_RADIUS:
        raise ValueError(f"variant must be one of {sorted(DEFAULT_RADIUS)}, got {variant!r}")
    r = DEFAULT_RADIUS[variant] if r is None else float(r)
    check_positive(r, "r")
    if height_scale is not None:
        check_positive(height_scale, "height_scale")
    if variant == "penumbral":
        return partial(xi_map, r=r), partial(penumbral_lca_height, r=r, squared=squared)
    return partial(psi_map, height_scale=height_scale), partial(umbral_lca_height, r=r)


def penumbral(
    q: Tensor, k: Tensor, r: float = 1.0, gamma: float = 1.0, squared: bool = False
) -> Tensor:
    r"""Dense penumbral logits :math:`-\gamma H(\xi(q_i), \xi(k_j))` (or :math:`-\gamma H^2`).

    Args:
        q: queries ``[..., n, d]`` (``d >= 2``).
        k: keys ``[..., m, d]``; leading dimensions broadcast with ``q``'s.
        r: light-source height of the ξ map (1 in the paper).
        gamma: softmax temperature :math:`\gamma > 0` (not given in the paper; code uses 1).
        squared: score :math:`-\gamma H^2` as in the authors' code.

    Returns:
        Logits ``[..., n, m]`` in float32 (float64 for float64 inputs); heights saturate at
        horizontal distances of ``sqrt(finfo.max)``, so huge inputs give finite logits.
    """
    geometry = cone_geometry("penumbral", r, squared=squared)
    return _cone_scores(q, k, *geometry, gamma, _dense_pairs)


def umbral(
    q: Tensor,
    k: Tensor,
    r: float = 0.1,
    gamma: float = 1.0,
    height_scale: float | None = 1.0,
) -> Tensor:
    r"""Dense umbral logits :math:`-\gamma H(\psi(q_i), \psi(k_j))`.

    Args:
        q: queries ``[..., n, d]`` (``d >= 2``).
        k: keys ``[..., m, d]``.
        r: hyperbolic ball radius (0.1 in the paper's runs, 1 in the authors' code).
        gamma: softmax temperature :math:`\gamma > 0`.
        height_scale: ψ height temperature ``c`` in :math:`e^{c x_d}`: paper 1;
            ``None`` for ``1/d`` as in the authors' code.

    Returns:
        Logits ``[..., n, m]``.
    """
    geometry = cone_geometry("umbral", r, height_scale=height_scale)
    return _cone_scores(q, k, *geometry, gamma, _dense_pairs)


def penumbral_edge(
    q: Tensor,
    k: Tensor,
    edge_index: Tensor,
    r: float = 1.0,
    gamma: float = 1.0,
    squared: bool = False,
) -> Tensor:
    r"""Penumbral logit of every edge ``j -> i``: :math:`-\gamma H(\xi(q_i), \xi(k_j))`.

    Equal to :func:`penumbral` on all pairs, read off at ``[i, j]`` for each edge.

    Args:
        q: target-node queries ``[N_dst, ..., d]``.
        k: source-node keys ``[N_src, ..., d]`` (same trailing shape as ``q``).
        edge_index: ``[2, E]``, row 0 = source ``j``, row 1 = target ``i`` (PyG).

    Returns:
        Logits ``[E, ...]`` (e.g. ``[E, heads]`` for ``[N, heads, d]`` inputs).
    """
    _check_edges(q, k, edge_index)
    geometry = cone_geometry("penumbral", r, squared=squared)
    return _cone_scores(q, k, *geometry, gamma, partial(edge_pairs, edge_index=edge_index))


def umbral_edge(
    q: Tensor,
    k: Tensor,
    edge_index: Tensor,
    r: float = 0.1,
    gamma: float = 1.0,
    height_scale: float | None = 1.0,
) -> Tensor:
    r"""Umbral logit of every edge ``j -> i``: :math:`-\gamma H(\psi(q_i), \psi(k_j))`.

    Shapes as in :func:`penumbral_edge`; parameters as in :func:`umbral`.
    """
    _check_edges(q, k, edge_index)
    geometry = cone_geometry("umbral", r, height_scale=height_scale)
    return _cone_scores(q, k, *geometry, gamma, partial(edge_pairs, edge_index=edge_index))
