"""The maps to the half-space: the ranges of their heights, and the ψ map's saturation of
far points (umbral scores that are never NaN)."""

from __future__ import annotations

import torch

from hiergraph.ops.cone.maps import psi_map, xi_map
from hiergraph.ops.cone.scores import umbral, umbral_edge


def test_map_ranges():
    x = torch.randn(1000, 4) * 10
    r = 0.7
    _, y_xi = xi_map(x, r)
    assert ((y_xi > 0) & (y_xi <= r)).all()  # == r only where float32 sigmoid saturates
    moderate = x[:, -1].abs() < 10
    assert (y_xi[moderate] < r).all()
    _, y_psi = psi_map(x)
    assert (y_psi > 0).all()


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
