"""What the cone tests share: the score functions by variant, random points of the
half-space and the LCA heights of all their pairs."""

from __future__ import annotations

import math

import torch

from hiergraph.ops.cone.heights import penumbral_lca_height, umbral_lca_height
from hiergraph.ops.cone.scores import penumbral, penumbral_edge, umbral, umbral_edge

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
