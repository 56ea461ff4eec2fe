"""Cone-attention scores: the invariants of notes/cone_attention.md §7, dense vs edge forms,
gradients, autocast and bad inputs."""

from __future__ import annotations

import math

import pytest
import torch

from hiergraph.ops.cone import (
    _check_edges,
    cone_geometry,
    edge_distance,
    edge_pairs,
    penumbral,
    penumbral_edge,
    penumbral_lca_height,
    psi_map,
    umbral,
    umbral_edge,
    umbral_lca_height,
    xi_map,
)
from tests.conftest import DispatchedOps, assert_same_gradients

DENSE = {"penumbral": penumbral, "umbral": umbral}
EDGE = {"penumbral": penumbral_edge, "umbral": umbral_edge}


def t(*values):
    return torch.tensor(values, dtype=torch.float64)


def half_space_points(n, d, r=1.0, seed=0):
    """Random half-space points: horizontal ``[n, d-1]`` and heights in ``(0, r)``."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d - 1, generator=gen, dtype=torch.float64) * 0.6
    y = torch.rand(n, generator=gen, dtype=torch.float64) * 0.98 * r + 0.01 * r
    return x, y


def height(variant, u, v, r, **kw):
    """H(u, v) for half-space points ``u = (x, y)``, all pairs ``[n, m]``."""
    dist = torch.cdist(u[0], v[0], compute_mode="donot_use_mm_for_euclid_dist")
    fn = penumbral_lca_height if variant == "penumbral" else umbral_lca_height
    return fn(dist, u[1][:, None], v[1][None, :], r, **kw)


def in_cone(variant, u, v, r):
    """Is ``v`` in the cone of ``u`` (``u`` an ancestor of ``v``)? Note §1.4."""
    dist = torch.linalg.vector_norm(u[0] - v[0], dim=-1)
    if variant == "penumbral":
        bound = torch.sqrt(r**2 - v[1] ** 2) - torch.sqrt(r**2 - u[1] ** 2)
        return (v[1] <= u[1]) & (dist <= bound)
    return dist <= math.sinh(r) * (u[1] - v[1])


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


def test_reference_code_parity_golden():
    q, k = t(0.5, -1.0, 0.2)[None], t(-0.3, 0.4, -0.7)[None]
    (qx, qy), (kx, ky) = xi_map(q), xi_map(k)
    assert qy.item() == pytest.approx(0.549834, abs=1e-6)
    assert ky.item() == pytest.approx(0.331812, abs=1e-6)
    assert torch.linalg.vector_norm(qx - kx).item() == pytest.approx(0.778529, abs=1e-6)
    assert penumbral(q, k, squared=True).item() == pytest.approx(-0.749954, abs=1e-6)
    assert penumbral(q, k).item() == pytest.approx(-0.865999, abs=1e-6)
    d = q.size(-1)
    assert umbral(q, k, r=1.0, height_scale=1 / d).item() == pytest.approx(-1.605299, abs=1e-6)
    assert umbral(q, k, r=0.1, height_scale=1 / d).item() == pytest.approx(-8.848464, abs=1e-6)
    assert umbral(q, k, r=0.1).item() == pytest.approx(-8.897939, abs=1e-6)
    assert umbral(q, k, r=0.1, height_scale=None).item() == pytest.approx(-8.848464, abs=1e-6)


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


def test_map_ranges():
    x = torch.randn(1000, 4) * 10
    r = 0.7
    _, y_xi = xi_map(x, r)
    assert ((y_xi > 0) & (y_xi <= r)).all()  # == r only where float32 sigmoid saturates
    moderate = x[:, -1].abs() < 10
    assert (y_xi[moderate] < r).all()
    _, y_psi = psi_map(x)
    assert (y_psi > 0).all()


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


def test_edge_distance_matches_vector_norm():
    gen = torch.Generator().manual_seed(22)
    a = torch.randn(7, 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    edge_index = torch.stack(
        [torch.randint(0, 6, (40,), generator=gen), torch.randint(0, 7, (40,))]
    )
    dist = edge_distance(a, b, edge_index)
    ref = torch.linalg.vector_norm(a[edge_index[1]] - b[edge_index[0]], dim=-1)
    torch.testing.assert_close(dist, ref)
    weight = torch.randn(dist.shape, generator=gen, dtype=torch.float64)
    assert_same_gradients(dist, ref, (a, b), weight)
    assert torch.autograd.gradcheck(lambda x, y: edge_distance(x, y, edge_index), (a, b))
    # zero distance (self loops on shared points): zero subgradient, as vector_norm
    loops = torch.arange(7).repeat(2, 1)
    (grad,) = torch.autograd.grad(edge_distance(a, a, loops).sum(), a)
    assert (grad == 0).all()


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


def test_edge_distance_shared_points_gradient():
    """Queries and keys that are one tensor (shared projections) take the one-buffer backward."""
    gen = torch.Generator().manual_seed(24)
    a = torch.randn(7, 2, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    edge_index = torch.randint(0, 7, (2, 50), generator=gen)
    dist = edge_distance(a, a, edge_index)
    ref = torch.linalg.vector_norm(a[edge_index[1]] - a[edge_index[0]], dim=-1)
    torch.testing.assert_close(dist, ref)
    weight = torch.randn(dist.shape, generator=gen, dtype=torch.float64)
    (grad,) = torch.autograd.grad((dist * weight).sum(), a)
    (ref_grad,) = torch.autograd.grad((ref * weight).sum(), a)
    torch.testing.assert_close(grad, ref_grad)
    assert torch.autograd.gradcheck(lambda x: edge_distance(x, x, edge_index), (a,))


@pytest.mark.parametrize("shared", [False, True])
def test_edge_pairs_match_gathered_reference(shared):
    """``edge_pairs`` = (distance, target height, source height) per edge, values and gradients."""
    gen = torch.Generator().manual_seed(25)

    def points(n):
        return (
            torch.randn(n, 2, 3, generator=gen, dtype=torch.float64, requires_grad=True),
            torch.rand(n, 2, generator=gen, dtype=torch.float64).requires_grad_(),
        )

    u = points(6)
    v = u if shared else points(6)
    edge_index = torch.randint(0, 6, (2, 40), generator=gen)
    src, dst = edge_index
    pairs = edge_pairs(u, v, edge_index)
    ref = (
        torch.linalg.vector_norm(u[0][dst] - v[0][src], dim=-1),
        u[1][dst],
        v[1][src],
    )
    inputs = [*u] if shared else [*u, *v]
    weights = [torch.randn(40, 2, generator=gen, dtype=torch.float64) for _ in range(3)]

    def loss(outputs):
        return sum((w * x).sum() for w, x in zip(weights, outputs, strict=True))

    grads = torch.autograd.grad(loss(pairs), inputs)
    ref_grads = torch.autograd.grad(loss(ref), inputs)
    for out, expected in zip((*pairs, *grads), (*ref, *ref_grads), strict=True):
        torch.testing.assert_close(out, expected)


def test_edge_range_check_reads_values_on_cpu_only():
    """Validation never reads index values off the CPU (no host sync in a GPU forward)."""
    q = torch.empty(4, 2, 3, device="meta")  # reading a meta tensor's values raises
    _check_edges(q, q, torch.empty(2, 5, dtype=torch.long, device="meta"))
    with pytest.raises(ValueError, match=r"\[2, E\]"):
        _check_edges(q, q, torch.empty(3, 5, dtype=torch.long, device="meta"))
    with pytest.raises(ValueError, match="out of range"):
        _check_edges(torch.zeros(4, 2, 3), torch.zeros(4, 2, 3), torch.tensor([[0], [4]]))
    # 1-D points: the node axis would be read as the features (one score for all edges)
    with pytest.raises(ValueError, match="need a node and a feature dimension"):
        penumbral_edge(torch.randn(3), torch.randn(3), torch.tensor([[0, 1], [2, 2]]))


def test_hand_written_backwards_refuse_double_backward():
    dist = torch.rand(5, dtype=torch.float64, requires_grad=True)
    y = torch.full((5,), 0.4, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(penumbral_lca_height(dist, y, y).sum(), dist, create_graph=True)
    with pytest.raises(RuntimeError):  # never a silently wrong second derivative
        torch.autograd.grad(grad.sum(), dist)


# ---------------------------------------------------------------------------
# Dense vs edge form, gradients, numerics
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["penumbral", "umbral"])
@pytest.mark.parametrize("kwargs", [{}, {"r": 0.5, "gamma": 2.0}])
def test_edge_form_equals_dense(variant, kwargs):
    heads, d = 3, 4
    q, k = torch.randn(8, heads, d, dtype=torch.float64), torch.randn(6, heads, d).double()
    edge_index = torch.stack([torch.randint(0, 6, (30,)), torch.randint(0, 8, (30,))])
    edge = EDGE[variant](q, k, edge_index, **kwargs)  # [E, heads]
    dense = DENSE[variant](q.transpose(0, 1), k.transpose(0, 1), **kwargs)  # [heads, 8, 6]
    assert edge.shape == (30, heads)
    torch.testing.assert_close(edge, dense[:, edge_index[1], edge_index[0]].T)


@pytest.mark.parametrize("variant", ["penumbral", "umbral"])
def test_a_single_edge_and_head(variant):
    # one edge, one head: the gathered height column is contiguous by itself (it was
    # aliased and overwritten by the in-place difference)
    q, k = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    dense = DENSE[variant](q, k)
    for edges in ([[1], [0]], [[1, 2], [0, 0]]):
        edge_index = torch.tensor(edges)
        got = EDGE[variant](q, k, edge_index)
        torch.testing.assert_close(got, dense[edge_index[1], edge_index[0]], rtol=0, atol=1e-12)


@pytest.mark.parametrize("variant", ["penumbral", "umbral"])
def test_dense_equals_edge_for_many_points_and_self_pairs(variant):
    # above 25 rows cdist's default switches to |u|^2 + |v|^2 - 2u.v, which cancels to
    # D ~ 1e-2 at u = v in float32; the dense form must keep the exact zero
    q = 2 * torch.randn(100, 64)
    dense = DENSE[variant](q, q)
    loops = torch.arange(100).repeat(2, 1)
    torch.testing.assert_close(dense.diagonal(), EDGE[variant](q, q, loops), rtol=1e-6, atol=1e-6)
    edges = torch.randint(0, 100, (2, 300), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(
        dense[edges[1], edges[0]], EDGE[variant](q, q, edges), rtol=1e-5, atol=1e-5
    )


def test_squared_option_matches_dense_and_edge():
    q = torch.randn(5, 2, 3, dtype=torch.float64)
    edge_index = torch.stack([torch.arange(5), torch.arange(5).roll(1)])
    dense = penumbral(q.transpose(0, 1), q.transpose(0, 1), squared=True)
    torch.testing.assert_close(
        penumbral_edge(q, q, edge_index, squared=True), dense[:, edge_index[1], edge_index[0]].T
    )


@pytest.mark.parametrize("variant", ["penumbral", "umbral"])
def test_gradcheck(variant):
    q = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: DENSE[variant](a, b, gamma=0.8), (q, k))
    edge_index = torch.tensor([[0, 1, 3, 2, 0], [4, 0, 1, 2, 3]])
    qe = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    ke = torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: EDGE[variant](a, b, edge_index), (qe, ke))


@pytest.mark.parametrize("variant", ["penumbral", "umbral"])
@pytest.mark.parametrize("squared", [False, True])
@pytest.mark.parametrize("case", ["extreme", "zeros", "light_source", "huge"])
def test_finite_forward_and_backward_float32(variant, squared, case):
    x = torch.randn(6, 4)
    if case == "extreme":
        x[:, -1] = torch.tensor([30.0, -30.0, 100.0, -100.0, 0.0, 17.0])
    elif case == "zeros":
        x = torch.zeros(6, 4)
    elif case == "light_source":
        x[:, -1] = 17.0 + torch.arange(6.0)  # sigmoid == 1 in float32
    else:
        x = x * 1e4
    x.requires_grad_()
    kw = {"squared": squared} if variant == "penumbral" else {}
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 0], [0, 1, 2, 3, 4, 5, 5]])  # self loops
    for scores in (DENSE[variant](x, x, **kw), EDGE[variant](x, x, edge_index, **kw)):
        assert torch.isfinite(scores).all()
        (grad,) = torch.autograd.grad(scores.softmax(0).square().sum() + scores.sum(), x)
        assert torch.isfinite(grad).all()


@pytest.mark.parametrize("variant", ["penumbral", "umbral"])
def test_float32_under_autocast(variant):
    q, k = torch.randn(3, 7, 8), torch.randn(3, 5, 8)
    expected = DENSE[variant](q, k)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = DENSE[variant](q.bfloat16(), k.bfloat16())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, DENSE[variant](q.bfloat16().float(), k.bfloat16().float()))
    assert out.shape == expected.shape


# ---------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["penumbral", "umbral"])
def test_bad_inputs(variant):
    fn, edge_fn = DENSE[variant], EDGE[variant]
    with pytest.raises(ValueError, match="size d >= 2"):
        fn(torch.randn(3, 1), torch.randn(3, 1))
    with pytest.raises(ValueError, match=r"q must be \[\.\.\., n, d\]"):  # (a cdist error)
        fn(torch.randn(4), torch.randn(3, 4))
    with pytest.raises(TypeError, match="floating-point"):
        fn(torch.ones(3, 2, dtype=torch.long), torch.ones(3, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="torch.Tensor"):
        fn([[0.0, 1.0]], torch.randn(1, 2))
    with pytest.raises(ValueError, match="same feature size"):
        fn(torch.randn(3, 4), torch.randn(3, 5))
    with pytest.raises(ValueError, match="gamma must be a finite number > 0"):
        fn(torch.randn(3, 4), torch.randn(3, 4), gamma=0.0)
    with pytest.raises(TypeError, match="gamma must be a finite number > 0"):
        fn(torch.randn(3, 4), torch.randn(3, 4), gamma="1")
    learned = torch.tensor(0.5, requires_grad=True)  # a learned temperature gets its gradient
    fn(torch.randn(3, 4), torch.randn(3, 4), gamma=learned).sum().backward()
    assert learned.grad is not None and learned.grad != 0
    q = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)  # (dropped when q needed
    k = torch.randn(3, 4, dtype=torch.float64)  # one: the custom backward took a float)
    learned = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    scores = fn(q, k, gamma=learned)
    scores.sum().backward()
    torch.testing.assert_close(learned.grad, scores.detach().sum() / 0.5)  # d(-g H)/dg = -H
    for r in (-1.0, float("inf"), float("nan")):  # (inf gave NaN scores)
        with pytest.raises(ValueError, match="r must be a finite number > 0"):
            fn(torch.randn(3, 4), torch.randn(3, 4), r=r)
    x = torch.randn(4, 2, 3)
    with pytest.raises(ValueError, match=r"\[2, E\]"):
        edge_fn(x, x, torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(TypeError, match="int64 or int32 tensor"):
        edge_fn(x, x, torch.zeros(2, 5))
    with pytest.raises(ValueError, match="out of range"):
        edge_fn(x, x, torch.tensor([[0, 4], [1, 1]]))
    with pytest.raises(ValueError, match="must agree"):
        edge_fn(x, torch.randn(4, 3, 3), torch.tensor([[0], [1]]))


def test_cone_geometry_rejects_unknown_variant():
    with pytest.raises(ValueError, match="variant must be one of"):
        cone_geometry("hyperboloid")


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
        for t in (0.5, 0.999, 1.001, 2.0):
            at = torch.tensor([t], dtype=torch.float64, requires_grad=True)

            def height(at, y_u, y_v, squared=squared, power=power):
                return penumbral_lca_height(at * far, y_u, y_v, squared=squared) / far**power

            assert torch.autograd.gradcheck(height, (at, y_u, y_v))


def test_umbral_scores_of_huge_inputs_are_never_nan():
    """The psi map's horizontal coordinates overflowed to inf from inputs of about 1e30, and
    a point's distance to itself was inf - inf: NaN scores and gradients. They saturate at
    finfo.max / 2 now: a far key scores -inf (a weight of 0), a point with itself stays
    finite, dense and edge forms alike, and no gradient is NaN."""
    edge_index = torch.tensor([[0, 1, 2, 3, 2], [0, 0, 2, 3, 0]])
    for far in (1e30, 1e38):
        x = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [far, 0.0, 0.0], [far, 1.0, 3.0]])
        x.requires_grad_()
        dense = umbral(x, x)
        edge = umbral_edge(x, x, edge_index)
        assert torch.equal(dense[edge_index[1], edge_index[0]], edge)
        assert torch.isfinite(dense.diagonal()).all() and not dense.isnan().any()
        assert dense[0, 2] == float("-inf") and dense.softmax(-1)[0, 2] == 0
        loss = dense.softmax(-1)[:, 1].sum() + edge.sum() + dense.diagonal().sum()
        (grad,) = torch.autograd.grad(loss, x)
        assert torch.isfinite(grad).all()
    horizontal, _ = psi_map(torch.tensor([[1e30, -1e30, 20.0]]))
    limit = torch.finfo(torch.float32).max / 2
    assert horizontal.tolist() == [[limit, -limit]]


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


def test_the_compute_dtype_is_read_without_dispatching():
    """The scores' dtype and the radius check come from the inputs' dtypes alone: no
    ``promote_types`` reaches the dispatcher (one per input and call before)."""
    q, k = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    with DispatchedOps() as ops:
        penumbral(q, k)
        umbral(q.half(), k)
    names = [name for name, _ in ops.calls]
    assert names and "promote_types" not in names


def test_a_learned_temperature_is_read_on_the_host_only_where_that_is_free():
    """On an accelerator the check of a tensor ``gamma`` would wait for every queued kernel
    on each call: it is left to the scores there (emulated on the CPU)."""
    from hiergraph._device import cpu_as_accelerator
    from tests.host_sync import HostSyncRecorder

    q, k = torch.randn(3, 4), torch.randn(5, 4)
    gamma = torch.tensor(0.5, requires_grad=True)
    with cpu_as_accelerator(), HostSyncRecorder() as rec:
        penumbral(q, k, gamma=gamma)
    assert rec.unique_syncs() == []
    with pytest.raises(ValueError, match="gamma must be a finite number > 0"):  # the CPU reads
        penumbral(q, k, gamma=torch.tensor(-1.0))
