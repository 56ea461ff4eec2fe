"""Inputs shared by the H-matrix tests."""

import torch


def qkv(length, dim=4, batch=2, heads=3, dtype=torch.float64, seed=0):
    """Random ``q, k, v`` ``[batch, heads, length, dim]``."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, length, dim, generator=gen, dtype=dtype) for _ in range(3)]
