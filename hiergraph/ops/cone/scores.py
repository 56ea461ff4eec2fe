r"""Cone attention scores on raw Euclidean vectors, :math:`-\gamma H(\mathrm{map}(q),
\mathrm{map}(k))`: dense ``[..., n, m]`` (:func:`penumbral`, :func:`umbral`) and per
``edge_index`` column ``[E, ...]`` (:func:`penumbral_edge`, :func:`umbral_edge`), each
variant's map and height bound by :func:`cone_geometry` (with the paper's radii,
:data:`DEFAULT_RADIUS`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

from hiergraph._checks import check_positive
from hiergraph.ops.cone.edges import edge_pairs
from hiergraph.ops.cone.heights import (
    HeightFn,
    compute_dtype,
    penumbral_lca_height,
    umbral_lca_height,
)
from hiergraph.ops.cone.maps import HalfSpaceMap, psi_map, xi_map
from hiergraph.ops.edge_index import check_edge_index

#: The paper's experimental setting: penumbral light source at height 1, umbral radius 0.1.
DEFAULT_RADIUS = {"penumbral": 1.0, "umbral": 0.1}


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


def _dense_pairs(u: tuple[Tensor, Tensor], v: tuple[Tensor, Tensor]):
    """All pairs: ``D [..., n, m]``, ``u_d [..., n, 1]``, ``v_d [..., 1, m]``.

    ``D`` from coordinate differences, never from ``|u|^2 + |v|^2 - 2 u.v``
    (which ``cdist`` would use above 25 rows and which cancels to ~1e-2 where
    ``D = 0``): the dense scores equal the edge scores, self-pairs included.
    """
    (ux, uy), (vx, vy) = u, v
    dist = torch.cdist(ux, vx, compute_mode="donot_use_mm_for_euclid_dist")
    return dist, uy.unsqueeze(-1), vy.unsqueeze(-2)


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
    dtype = compute_dtype(q, k)
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
            takes the paper's value from :data:`~hiergraph.ops.cone.scores.DEFAULT_RADIUS`.
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
        r: light-source height of the ξ map (1 in the paper).
        gamma: softmax temperature :math:`\gamma > 0`.
        squared: score :math:`-\gamma H^2` as in the authors' code.

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

    Equal to :func:`umbral` on all pairs, read off at ``[i, j]`` for each edge.

    Args:
        q: target-node queries ``[N_dst, ..., d]``.
        k: source-node keys ``[N_src, ..., d]`` (same trailing shape as ``q``).
        edge_index: ``[2, E]``, row 0 = source ``j``, row 1 = target ``i`` (PyG).
        r: hyperbolic ball radius (0.1 in the paper's runs, 1 in the authors' code).
        gamma: softmax temperature :math:`\gamma > 0`.
        height_scale: ψ height temperature ``c`` in :math:`e^{c x_d}`: paper 1;
            ``None`` for ``1/d`` as in the authors' code.

    Returns:
        Logits ``[E, ...]``, as in :func:`penumbral_edge`.
    """
    _check_edges(q, k, edge_index)
    geometry = cone_geometry("umbral", r, height_scale=height_scale)
    return _cone_scores(q, k, *geometry, gamma, partial(edge_pairs, edge_index=edge_index))
