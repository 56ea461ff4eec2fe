"""Cone attention scores: parity with the authors' code, dense vs edge forms, gradients,
numerics, autocast and bad inputs."""

from __future__ import annotations

import pytest
import torch

from hiergraph.ops.cone.maps import xi_map
from hiergraph.ops.cone.scores import _check_edges, cone_geometry, penumbral, penumbral_edge, umbral
from tests.conftest import DispatchedOps
from tests.ops.cone.cases import DENSE, EDGE, t


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
