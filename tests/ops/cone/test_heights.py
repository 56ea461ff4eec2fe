"""LCA heights: golden values, their invariants (Tseng et al. §3.1, Theorems 1–2), the
hand-written backward passes against autograd, and the radii and distances where the
heights would overflow."""

from __future__ import annotations

import math

import pytest
import torch

from hiergraph.ops.cone.heights import penumbral_lca_height, umbral_lca_height
from hiergraph.ops.cone.maps import psi_map, xi_map
from hiergraph.ops.cone.scores import penumbral, penumbral_edge, umbral
from tests.ops.cone.cases import DENSE, half_space_points, height, in_cone, t

# ---------------------------------------------------------------------------
# Golden values (note §7.3, §7.4, §7.8)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dist", "yu", "yv", "expected", "squared"),
    [
        (0.1, 0.5, 0.2, 0.5, False),  # ancestor
        (0.3, 0.5, 0.4, 0.671207, False),  # in-cone
        (0.3, 0.5, 0.4, 0.450518, True),
        (2.0, 0.5, 0.4, 1.097955, False),  # out of cone
        (2.0, 0.5, 0.4, 1.205506, True),
        (0.8 + 0.916515, 0.6, 0.4, 1.0, False),  # on the boundary
    ],
)
def test_penumbral_golden(dist, yu, yv, expected, squared):
    h = penumbral_lca_height(t(dist), t(yu), t(yv), r=1.0, squared=squared)
    assert h.item() == pytest.approx(expected, abs=2e-6)


@pytest.mark.parametrize(("dist", "expected"), [(0.02, 0.5), (0.1, 0.849168)])
def test_umbral_golden(dist, expected):
    assert umbral_lca_height(t(dist), t(0.5), t(0.2), r=0.1).item() == pytest.approx(
        expected, abs=1e-6
    )


# ---------------------------------------------------------------------------
# Invariants
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["penumbral", "umbral"])
def test_symmetry(variant):
    u, v = half_space_points(40, 4, seed=1), half_space_points(30, 4, seed=2)
    torch.testing.assert_close(height(variant, u, v, 1.0), height(variant, v, u, 1.0).T)
    q, k = torch.randn(2, 7, 5, dtype=torch.float64), torch.randn(2, 6, 5, dtype=torch.float64)
    torch.testing.assert_close(DENSE[variant](q, k), DENSE[variant](k, q).transpose(-1, -2))


def test_penumbral_symmetry_spans_both_branches():
    h = height("penumbral", *[half_space_points(60, 3, seed=s) for s in (3, 4)], 1.0)
    assert (h < 1).any() and (h > 1).any()


@pytest.mark.parametrize("variant", ["penumbral", "umbral"])
def test_self_similarity_and_zero_distance(variant):
    u = half_space_points(25, 3, seed=5)
    torch.testing.assert_close(height(variant, u, u, 1.0).diagonal(), u[1])
    y_u, y_v = u[1][:, None], u[1][None, :]
    fn = penumbral_lca_height if variant == "penumbral" else umbral_lca_height
    torch.testing.assert_close(
        fn(torch.zeros(25, 25, dtype=torch.float64), y_u, y_v, 1.0), torch.maximum(y_u, y_v)
    )
    q = torch.randn(4, 25, 6, dtype=torch.float64)
    gamma = 0.7
    mapped_height = (xi_map(q) if variant == "penumbral" else psi_map(q))[1]
    torch.testing.assert_close(
        DENSE[variant](q, q, gamma=gamma).diagonal(dim1=-2, dim2=-1), -gamma * mapped_height
    )


@pytest.mark.parametrize(("variant", "r"), [("penumbral", 1.0), ("umbral", 0.1), ("umbral", 1.0)])
def test_ancestor_height_is_the_row_maximum(variant, r):
    u = half_space_points(50, 3, r=r if variant == "penumbral" else 1.0, seed=6)
    v = half_space_points(80, 3, r=r if variant == "penumbral" else 1.0, seed=7)
    h = height(variant, u, v, r)
    assert (h >= torch.maximum(u[1][:, None], v[1][None, :]) - 1e-12).all()
    members = in_cone(variant, (u[0][:, None], u[1][:, None]), (v[0][None], v[1][None]), r)
    assert members.any()
    torch.testing.assert_close(h[members], u[1][:, None].expand_as(h)[members])
    assert (h[~members] > u[1][:, None].expand_as(h)[~members]).all()


def test_penumbral_branch_test_and_boundary_continuity():
    r = 1.0
    u, v = half_space_points(200, 2, seed=8), half_space_points(200, 2, seed=9)
    dist = torch.cdist(u[0], v[0])
    s_u, s_v = torch.sqrt(r**2 - u[1] ** 2)[:, None], torch.sqrt(r**2 - v[1] ** 2)[None, :]
    eq23 = ((dist - s_u) ** 2 + v[1][None, :] ** 2 < r**2) | (dist <= s_u)
    symmetric = dist < s_u + s_v
    assert (eq23 == symmetric).float().mean() > 0.999  # ties only on the measure-zero boundary
    h = penumbral_lca_height(dist, u[1][:, None], v[1][None, :], r)
    assert (h[symmetric] <= r + 1e-12).all() and (h[~symmetric] >= r - 1e-12).all()
    boundary = (s_u + s_v).expand_as(dist)
    for delta in (-1e-9, 0.0, 1e-9):
        hb = penumbral_lca_height(boundary + delta, u[1][:, None], v[1][None, :], r)
        torch.testing.assert_close(hb, torch.full_like(hb, r), atol=1e-6, rtol=0)


@pytest.mark.parametrize("variant", ["penumbral", "umbral"])
def test_monotone_in_horizontal_distance(variant):
    y_u, y_v = torch.rand(30, 1, dtype=torch.float64) * 0.9 + 0.05, torch.rand(30, 1).double() * 0.9
    dist = torch.linspace(0, 4, 400, dtype=torch.float64)[None, :]
    fn = penumbral_lca_height if variant == "penumbral" else umbral_lca_height
    h = fn(dist, y_u, y_v + 0.05, 1.0)
    assert (h.diff(dim=-1) >= -1e-12).all()


def test_umbral_laplacian_reduction_and_homogeneity():
    r, gamma = 0.1, 1.3
    x = torch.randn(20, 3, dtype=torch.float64)
    y = torch.full((20,), 0.4, dtype=torch.float64)
    scores = -gamma * height("umbral", (x, y), (x, y), r)
    laplace = -gamma / (2 * math.sinh(r)) * torch.cdist(x, x)
    torch.testing.assert_close(scores.softmax(-1), laplace.softmax(-1))
    u, v = half_space_points(15, 4, seed=10), half_space_points(12, 4, seed=11)
    lam = 3.7
    torch.testing.assert_close(
        height("umbral", (lam * u[0], lam * u[1]), (lam * v[0], lam * v[1]), r),
        lam * height("umbral", u, v, r),
    )


@pytest.mark.parametrize("variant", ["penumbral", "umbral"])
def test_rotation_and_translation_invariance(variant):
    q, k = torch.randn(9, 5, dtype=torch.float64), torch.randn(11, 5, dtype=torch.float64)
    rot, _ = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64))
    rotate = lambda x: torch.cat([x[:, :-1] @ rot, x[:, -1:]], dim=-1)  # noqa: E731
    torch.testing.assert_close(DENSE[variant](rotate(q), rotate(k)), DENSE[variant](q, k))
    u, v = half_space_points(9, 5, seed=12), half_space_points(11, 5, seed=13)
    shift = torch.randn(4, dtype=torch.float64)
    torch.testing.assert_close(
        height(variant, (u[0] + shift, u[1]), (v[0] + shift, v[1]), 1.0), height(variant, u, v, 1.0)
    )


@pytest.mark.parametrize(("variant", "r"), [("penumbral", 1.0), ("umbral", 0.5)])
def test_cone_relation_is_transitive(variant, r):
    # shrink horizontal spread so that many random triples are nested
    u, v, w = [(x * 0.3, y) for x, y in (half_space_points(20000, 3, seed=s) for s in (15, 16, 17))]
    chain = in_cone(variant, u, v, r) & in_cone(variant, v, w, r)
    assert chain.sum() > 10
    assert in_cone(variant, u, w, r)[chain].all()


# ---------------------------------------------------------------------------
# Hand-written backward passes vs autograd through the paper's formulas
# ---------------------------------------------------------------------------


def reference_height(variant, dist, y_u, y_v, r, squared=False):
    """The paper's eqs. 21-23 / 38 written directly with ``where``/``maximum`` (autograd)."""
    if variant == "umbral":
        return torch.maximum(torch.maximum(y_u, y_v), dist / (2 * math.sinh(r)) + (y_u + y_v) / 2)
    s_u, s_v = torch.sqrt(r**2 - y_u**2), torch.sqrt(r**2 - y_v**2)
    common = dist < s_u + s_v
    h2_in = torch.maximum(torch.maximum(y_u**2, y_v**2), r**2 - (s_u + s_v - dist) ** 2 / 4)
    safe = torch.where(common, torch.ones_like(dist), dist)
    h2_out = ((safe**2 + y_u**2 - y_v**2) / (2 * safe)) ** 2 + y_v**2
    h2 = torch.where(common, h2_in, h2_out)
    return h2 if squared else h2.sqrt()


@pytest.mark.parametrize(
    ("variant", "r", "squared"),
    [("penumbral", 1.0, False), ("penumbral", 0.6, True), ("umbral", 0.1, False)],
)
@pytest.mark.parametrize("shape", ["edges", "broadcast"])
def test_height_backward_matches_autograd_reference(variant, r, squared, shape):
    gen = torch.Generator().manual_seed(21)

    def rand(*size, lo=0.01, hi=0.99):
        x = lo + (hi - lo) * torch.rand(*size, generator=gen, dtype=torch.float64)
        return x.requires_grad_()

    if shape == "edges":
        dist, y_u, y_v = rand(3000, lo=0.0, hi=2.5), rand(3000), rand(3000)
    else:  # the dense form's [n, 1] x [1, m] layout
        dist, y_u, y_v = rand(40, 50, lo=0.0, hi=2.5), rand(40, 1), rand(1, 50)
    y_u, y_v = (y * (r if variant == "penumbral" else 1.0) for y in (y_u, y_v))
    kw = {"squared": squared} if variant == "penumbral" else {}
    fn = penumbral_lca_height if variant == "penumbral" else umbral_lca_height
    out, ref = fn(dist, y_u, y_v, r, **kw), reference_height(variant, dist, y_u, y_v, r, squared)
    torch.testing.assert_close(out, ref)
    weight = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    inputs = (dist, y_u, y_v)
    grads = torch.autograd.grad((out * weight).sum(), inputs)
    ref_grads = torch.autograd.grad((ref * weight).sum(), inputs)
    for grad, ref_grad, x in zip(grads, ref_grads, inputs, strict=True):
        assert grad.shape == x.shape
        torch.testing.assert_close(grad, ref_grad)


@pytest.mark.parametrize("variant", ["penumbral", "umbral"])
def test_scale_and_no_grad_path(variant):
    """``scale`` multiplies value and gradients; without autograd the same values come back."""
    gen = torch.Generator().manual_seed(23)
    dist = (2 * torch.rand(60, generator=gen, dtype=torch.float64)).requires_grad_()
    y_u = (0.01 + 0.98 * torch.rand(60, generator=gen, dtype=torch.float64)).requires_grad_()
    y_v = (0.01 + 0.98 * torch.rand(60, generator=gen, dtype=torch.float64)).requires_grad_()
    fn = penumbral_lca_height if variant == "penumbral" else umbral_lca_height
    plain, scaled = fn(dist, y_u, y_v), fn(dist, y_u, y_v, scale=-2.5)
    torch.testing.assert_close(scaled, -2.5 * plain)
    grads = torch.autograd.grad(plain.sum(), (dist, y_u, y_v))
    scaled_grads = torch.autograd.grad(scaled.sum(), (dist, y_u, y_v))
    for grad, scaled_grad in zip(grads, scaled_grads, strict=True):
        torch.testing.assert_close(scaled_grad, -2.5 * grad)
    with torch.no_grad():
        torch.testing.assert_close(fn(dist, y_u, y_v, scale=-2.5), scaled.detach())
    inputs = [x.detach().clone() for x in (dist, y_u, y_v)]
    fn(*inputs, scale=-2.5)
    for x, ref in zip(inputs, (dist, y_u, y_v), strict=True):
        assert torch.equal(x, ref.detach())  # inputs are never modified in place


def test_hand_written_backwards_refuse_double_backward():
    dist = torch.rand(5, dtype=torch.float64, requires_grad=True)
    y = torch.full((5,), 0.4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="differentiable once"):  # never a silently wrong
        torch.autograd.grad(penumbral_lca_height(dist, y, y).sum(), dist, create_graph=True)


# ---------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------


def test_umbral_radius_without_overflow():
    """The slope 1 / (2 sinh r) of the umbral height, for radii whose sinh overflows too:
    there the LCA height is that of an infinitely narrow ball, max(u_d, v_d)."""
    dist, y_u, y_v = torch.tensor([0.0, 1.0, 5.0]), torch.tensor([1.0, 2.0, 0.5]), torch.ones(3)
    for r in (0.1, 1.0, 20.0):
        slope = 1.0 / (2 * math.sinh(r))
        want = torch.maximum(torch.maximum(y_u, y_v), dist * slope + (y_u + y_v) / 2)
        torch.testing.assert_close(umbral_lca_height(dist, y_u, y_v, r), want)
    far = umbral_lca_height(dist, y_u, y_v, 1000.0)
    torch.testing.assert_close(far, torch.maximum(y_u, y_v))


def test_penumbral_radius_whose_square_overflows_is_refused():
    """A light source so high that (2r)^2 overflows the dtype would make every score NaN:
    refused with the limit named; float64 inputs take it, and finite scores come out."""
    q, k = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    assert torch.isfinite(penumbral(q, k, r=1e18)).all()
    with pytest.raises(ValueError, match="r = 1e.19 is too large for torch.float32"):
        penumbral(q, k, r=1e19)
    assert torch.isfinite(penumbral(q.double(), k.double(), r=1e19)).all()
    # the heights' own dtype bounds it: float16 ones from r = 128 (NaN before)
    d, y = torch.rand(6).half(), torch.rand(6).half() * 100
    assert torch.isfinite(penumbral_lca_height(d, y, y, r=127.0)).all()
    with pytest.raises(ValueError, match="too large for torch.float16"):
        penumbral_lca_height(d, y, y, r=128.0)
    with pytest.raises(ValueError, match="r must be a finite number > 0"):
        penumbral_lca_height(d, y, y, r=float("nan"))


def test_penumbral_heights_saturate_where_their_square_would_overflow():
    """Horizontal distances past sqrt(float32 max) ~ 1.8e19 made H^2 overflow and the
    scores and gradients NaN: the height saturates there, with slope 0, so a key that far
    gets a finite score, a weight of 0 and no NaN in any gradient (dense and edge forms)."""
    dist = torch.tensor([1e18, 1e19, 2e19, 1e30], requires_grad=True)
    y = torch.full((4,), 0.5)
    for squared in (False, True):
        h = penumbral_lca_height(dist, y, y, squared=squared)
        (grad,) = torch.autograd.grad(h.sum(), dist)
        assert torch.isfinite(h).all() and (h[2:] == h[2]).all() and h[1] < h[2]
        assert (grad[:2] > 0).all() and (grad[2:] == 0).all()
    for far in (1e20, 1e30, 1e38):
        x = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [far, 0.0, 0.0]], requires_grad=True)
        for squared in (False, True):
            dense = penumbral(x[:1], x, squared=squared)
            edge = penumbral_edge(x, x, torch.tensor([[0, 1, 2], [0, 0, 0]]), squared=squared)
            assert torch.equal(dense.flatten(), edge)
            weight = dense.softmax(-1)
            assert torch.isfinite(dense).all() and weight[0, 2] == 0
            (grad,) = torch.autograd.grad(weight[0, 1] + edge.sum(), x)
            assert torch.isfinite(grad).all()
    # the hand-written partials are those of the saturated height, on both sides of it
    far = torch.finfo(torch.float64).max ** 0.5
    y_u, y_v = (torch.tensor([h], dtype=torch.float64, requires_grad=True) for h in (0.3, 0.6))
    for squared in (False, True):
        power = 2 if squared else 1
        for fraction in (0.5, 0.999, 1.001, 2.0):
            at = torch.tensor([fraction], dtype=torch.float64, requires_grad=True)

            def height(at, y_u, y_v, squared=squared, power=power):
                return penumbral_lca_height(at * far, y_u, y_v, squared=squared) / far**power

            assert torch.autograd.gradcheck(height, (at, y_u, y_v))


def test_umbral_radius_whose_slope_overflows_is_refused():
    """So narrow a ball that 1 / (2 sinh r) overflows the dtype made self-pairs (D = 0, as
    0 * inf) NaN: refused with the limit named; float64 inputs take it. (Distinct points may
    score -inf there, a weight of 0, as documented.)"""
    q = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0))
    assert not umbral(q, q, r=1e-38).isnan().any()
    with pytest.raises(ValueError, match="r = 1e-39 is too small for torch.float32"):
        umbral(q, q, r=1e-39)
    assert torch.isfinite(umbral(q.double(), q.double(), r=1e-39)).all()
    d, y = torch.zeros(3), torch.ones(3)
    with pytest.raises(ValueError, match="r must be a finite number > 0"):
        umbral_lca_height(d, y, y, r=0.0)  # (a ZeroDivisionError before)
