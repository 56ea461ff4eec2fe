r"""Per-edge inputs of an LCA height: :func:`edge_pairs` gathers ``(D, u_d, v_d)`` for
every edge ``j -> i`` of an ``edge_index`` (one gather and one scatter per endpoint in a
hand-written backward, :class:`_EdgeGeometry`), and :func:`edge_distance` is the Euclidean
distance of every edge.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hiergraph._autograd import AutogradFunction, differentiable_once


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
    @differentiable_once
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
