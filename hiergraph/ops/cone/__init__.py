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

Layout of this package:

* :mod:`~hiergraph.ops.cone.maps`, maps to the half-space: :func:`xi_map` (sigmoid,
  penumbral) and :func:`psi_map` (exp, umbral); each returns ``(horizontal [..., d-1],
  height [...])``;
* :mod:`~hiergraph.ops.cone.heights`, LCA heights from ``(D, u_d, v_d)``:
  :func:`penumbral_lca_height`, :func:`umbral_lca_height` (elementwise, broadcasting);
* :mod:`~hiergraph.ops.cone.edges`, per-edge inputs of a height: :func:`edge_pairs`
  ``(D, u_d, v_d)`` and :func:`edge_distance`;
* :mod:`~hiergraph.ops.cone.scores`, scores on raw Euclidean vectors, dense
  ``[..., n, m]``: :func:`penumbral`, :func:`umbral`; and per ``edge_index`` column
  ``[E, ...]``: :func:`penumbral_edge`, :func:`umbral_edge`.

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

from hiergraph.ops.cone.edges import edge_distance, edge_pairs
from hiergraph.ops.cone.heights import HeightFn, penumbral_lca_height, umbral_lca_height
from hiergraph.ops.cone.maps import MAX_LOG_HEIGHT, HalfSpaceMap, psi_map, xi_map
from hiergraph.ops.cone.scores import (
    DEFAULT_RADIUS,
    cone_geometry,
    penumbral,
    penumbral_edge,
    umbral,
    umbral_edge,
)

__all__ = [
    "MAX_LOG_HEIGHT",
    "DEFAULT_RADIUS",
    "HalfSpaceMap",
    "HeightFn",
    "xi_map",
    "psi_map",
    "penumbral_lca_height",
    "umbral_lca_height",
    "edge_pairs",
    "edge_distance",
    "cone_geometry",
    "penumbral",
    "umbral",
    "penumbral_edge",
    "umbral_edge",
]
