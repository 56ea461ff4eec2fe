"""Per-edge geometry: ``edge_pairs`` and ``edge_distance`` against gathered references,
values and gradients (shared points take the one-buffer backward)."""

from __future__ import annotations

import pytest
import torch

from hiergraph.ops.cone.edges import edge_distance, edge_pairs
from tests.conftest import assert_same_gradients


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
