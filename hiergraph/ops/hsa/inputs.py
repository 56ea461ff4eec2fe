"""Checks of the inputs shared by the HSA ops."""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import Tensor

from hiergraph._checks import check_qkv_like
from hiergraph._precision import check_tensors

#: The family kernels of :func:`~hiergraph.ops.hierarchical_attention` (same result).
KERNELS = ("dense", "blocks", "edge")
#: Those of the strictly causal op (:func:`~hiergraph.ops.causal_hierarchical_attention`).
CAUSAL_KERNELS = ("dense", "edge")


def check_kernel(kernel: str, causal: bool = False) -> None:
    """Refuses a ``kernel`` that is not one of :data:`KERNELS` (:data:`CAUSAL_KERNELS`
    with ``causal``)."""
    allowed = CAUSAL_KERNELS if causal else KERNELS
    if kernel not in allowed:
        which = " (the strictly causal op's)" if causal else ""
        raise ValueError(f"kernel must be one of {allowed}{which}, got {kernel!r}")


def check_inputs(q, k, v, index, pos_emb, leaf_mask) -> Tensor | None:
    """The checks of :func:`~hiergraph.ops.hierarchical_attention`'s inputs ``[L, H, ·]``
    over the plan ``index`` (a :class:`~hiergraph.plan.TreeIndex`), and of the ops that
    share them: the shapes and dtypes (:func:`check_qkv`), one device for all, a ``[L]``
    bool ``leaf_mask``; returns ``pos_emb`` as :func:`head_pos_emb` views it (or ``None``)."""
    check_qkv(q, k, v, index.num_leaves, index.num_nodes)
    check_structure_device(index.device, q)
    pos = None if pos_emb is None else head_pos_emb(pos_emb, q, index.num_nodes)
    if leaf_mask is not None:
        check_leaf_flags(leaf_mask, "leaf_mask", "valid leaf", index.num_leaves, q)
    return pos


def no_leaves(q: Tensor, k: Tensor, v: Tensor, *more: Tensor | None) -> Tensor:
    """The output of HSA over a forest without leaves (``N = 0``, as a batch that filtered
    every tree out): ``[0, H, d_v]``, on the autograd graph of ``q, k, v`` and the
    embeddings ``more`` (their gradients: zeros of their shapes), as attention over no
    token gives."""
    reached = sum(t.sum() for t in (q, k, *more) if t is not None)
    return v + reached * 0


def check_leaf_flags(flags, name: str, meaning: str, num_leaves: int, q: Tensor) -> None:
    """Raise unless ``flags`` is a ``[num_leaves]`` bool tensor on ``q``'s device (a
    ``leaf_mask``, the hubs: ``True`` = ``meaning``)."""
    if not isinstance(flags, Tensor) or flags.dtype != torch.bool or flags.shape != (num_leaves,):
        got = (
            f"{flags.dtype} {tuple(flags.shape)}"
            if isinstance(flags, Tensor)
            else type(flags).__name__
        )
        raise ValueError(
            f"{name} must be a [{num_leaves}] bool tensor (True = {meaning}), got {got}"
        )
    if flags.device != q.device:
        raise ValueError(f"{name} is on {flags.device} but q is on {q.device}")


def check_structure_device(device: torch.device, q: Tensor, name: str = "q") -> None:
    """Raise unless the hierarchy's plan lives on ``q``'s device (``name``: ``q``'s name in
    the message)."""
    if device != q.device:
        raise ValueError(
            f"the hierarchy is on {device} but {name} is on {q.device}; move the hierarchy "
            f"(hierarchy.to({str(q.device)!r}), as the batch's other tensors: its cached tree "
            "plan moves with it) before calling"
        )


def head_pos_emb(pos_emb: Tensor, q: Tensor, num_nodes: int) -> Tensor:
    """``pos_emb`` ``[N, c]`` or ``[N, 1 | H, c]`` checked and viewed as ``[N, 1 | H, c]``
    in ``q``'s dtype (a float64 table with float32 ``q`` computes in float32)."""
    if not isinstance(pos_emb, Tensor) or not pos_emb.is_floating_point():
        got = pos_emb.dtype if isinstance(pos_emb, Tensor) else type(pos_emb).__name__
        raise TypeError(f"pos_emb must be a floating-point tensor, got {got}")
    if pos_emb.device != q.device:
        raise ValueError(f"pos_emb is on {pos_emb.device} but q is on {q.device}")
    ok = pos_emb.dim() in (2, 3) and pos_emb.size(0) == num_nodes
    if pos_emb.dim() == 3:
        ok = ok and pos_emb.size(1) in (1, q.size(1))
    if not ok:
        raise ValueError(
            f"pos_emb must be [num_nodes={num_nodes}, c] or [num_nodes, heads, c], "
            f"got {tuple(pos_emb.shape)}"
        )
    return (pos_emb if pos_emb.dim() == 3 else pos_emb.unsqueeze(1)).to(q.dtype)


def logit_scale(scale, q: Tensor) -> float:
    r"""The logit scale :math:`\tau`: ``scale``, a finite number, else :math:`1/\sqrt{d}` of
    ``q``'s ``d`` channels. A tensor is refused: the ops take no gradient through it (a
    learned temperature can scale ``q`` instead)."""
    if scale is None:
        return q.size(-1) ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, Real | torch.SymFloat):
        raise TypeError(
            f"scale must be a number, got {type(scale).__name__} (the op takes no gradient "
            "through it: to learn a temperature, scale q by it instead)"
        )
    if isinstance(scale, Real) and not math.isfinite(scale):  # (every logit NaN)
        raise ValueError(f"scale must be finite, got {scale}")
    return scale


def check_qkv(q, k, v, num_leaves: int, num_nodes: int | None = None) -> None:
    """Shared checks of HSA inputs: ``q, k [L, H, d]``, ``v [L, H, d_v]``, one floating
    dtype, one row per leaf (``num_nodes``, the hierarchy's node count, only words the
    error of rows given per node)."""
    check_tensors(q, k, v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            hint = (
                " (a batch dimension? batch the hierarchies with Batch.from_data_list or a "
                "DataLoader and pass the rows of all their leaves, [total leaves, heads, dim])"
                if t.dim() == 4
                else ""
            )
            raise ValueError(
                f"{name} must be [num_leaves, heads, dim], got shape {tuple(t.shape)}{hint}"
            )
    if q.shape != k.shape:
        raise ValueError(
            f"q and k must have the same shape, got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    if v.shape[:2] != q.shape[:2]:
        raise ValueError(
            f"v must be [num_leaves, heads, d_v] = [{q.size(0)}, {q.size(1)}, *], "
            f"got {tuple(v.shape)}"
        )
    if q.size(1) == 0 or q.size(2) == 0:
        raise ValueError(
            f"q and k need at least one head and one channel, got shape {tuple(q.shape)}"
        )
    if v.size(2) == 0:
        raise ValueError(f"v needs at least one channel, got shape {tuple(v.shape)}")
    check_qkv_like(q, k, v)
    if q.size(0) != num_leaves:
        if q.size(0) == num_nodes:
            hint = f" ({num_nodes} is its node count: the inner nodes take no rows)"
        elif q.size(1) == num_leaves:
            hint = ": [leaves, heads, dim], not [heads, leaves, dim] (q.transpose(0, 1))"
        else:
            hint = ""
        raise ValueError(
            f"q has {q.size(0)} rows but the hierarchy has {num_leaves} leaves; "
            f"pass one row per leaf, in leaf order{hint}"
        )
