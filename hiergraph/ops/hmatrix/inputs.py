"""Checks of the inputs of H-matrix attention, shared by the fast path and the dense
reference."""

from __future__ import annotations

import torch
from torch import Tensor

from hiergraph._checks import check_bool, check_qkv_like
from hiergraph.data.windows import check_block_size


def check_inputs(q, k, v, block_size, causal, key_padding_mask) -> None:
    """Raise ``TypeError`` / ``ValueError`` unless ``q, k, v`` ``[B, H, L, ·]``, the flag
    ``causal`` and ``key_padding_mask`` (bool ``[B, L]`` or ``None``) fit one H-matrix
    attention call."""
    check_block_size(block_size)
    check_bool(causal, "causal")  # ("no" was causal)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(
                f"{name} must have shape [batch, heads, length, dim], got {tuple(x.shape)}"
            )
    if q.shape != k.shape:
        raise ValueError(
            f"q and k must have the same shape, got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"v must match q in [batch, heads, length], got {tuple(v.shape)} vs {tuple(q.shape)}"
        )
    check_qkv_like(q, k, v)
    if q.shape[3] == 0:
        raise ValueError(f"q and k need at least one channel, got shape {tuple(q.shape)}")
    if key_padding_mask is not None:
        expected = (q.shape[0], q.shape[2])
        if not isinstance(key_padding_mask, Tensor):
            raise TypeError(
                f"key_padding_mask must be a bool tensor, got {type(key_padding_mask).__name__}"
            )
        if key_padding_mask.device != q.device:
            raise ValueError(
                f"key_padding_mask is on {key_padding_mask.device} but q is on {q.device}"
            )
        if key_padding_mask.dtype != torch.bool or tuple(key_padding_mask.shape) != expected:
            raise ValueError(
                f"key_padding_mask must be a bool tensor of shape [batch, length] = {expected} "
                f"(True = padding), got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
            )
