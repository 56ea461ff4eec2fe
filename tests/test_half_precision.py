"""Every op and layer in bfloat16 and float16 errs about as much as one rounding of its
float64 result.

Each case runs once in half precision and once in float64 on the same values (the half
inputs and parameters, widened), at sizes where a sum kept in half precision would show:
thousands of leaves, tokens or incoming edges. Ops must stay within 1.5 times the relative
error of rounding the float64 output to the half dtype (they compute in float32 and round
once); layers within 4 times (their projections, norms and residuals round in half precision
too; a stack of two PyTorch transformer layers lands at about 3 in bf16). Half-precision
sums that stall, scores that tie and rounded logits cost far more: before they were taken
in float32, these cases measured in bf16 3–5 times one rounding for H-matrix attention, 18
for the VCC encoder (its selection scores tied), 4 for the KV cache after 2,048 tokens (170
after 4,096) and 276 for masked attention, whose softmax summed 2,048 weights in bf16.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from hiergraph import nn as hnn
from hiergraph.data import window_hierarchy
from hiergraph.nn import HierarchicalKVCache, append_schedule
from hiergraph.ops import (
    banded_attention,
    causal_hierarchical_attention,
    hierarchical_attention,
    hmatrix_attention,
)
from tests.conftest import relative_error, rounding_error

OP_FACTOR, LAYER_FACTOR = 1.5, 4.0
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))]  # fmt: skip
HALVES = [torch.bfloat16, torch.float16]

#: ``run(dtype)``: a case's output computed in ``dtype`` (the half dtype or float64)
Run = Callable[[torch.dtype], torch.Tensor]


@dataclass(frozen=True)
class At:
    """Where a case runs: its device and half dtype."""

    device: str
    half: torch.dtype

    def randn(self, *shape: int, seed: int) -> torch.Tensor:
        """Standard normal values in the half dtype on the device."""
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
        return x.to(self.half).to(self.device)

    def qkv(self, *shape: int) -> list[torch.Tensor]:
        return [self.randn(*shape, seed=i) for i in range(3)]


def _op(fn: Callable, at: At) -> Run:
    """``fn(q, k, v, tree)`` on ``[L, H, d]`` rows over a 4,096-leaf window tree."""
    tree = window_hierarchy(4096, (16, 8, 4)).to(at.device)
    q, k, v = at.qkv(4096, 4, 32)
    return lambda dtype: fn(q.to(dtype), k.to(dtype), v.to(dtype), tree)


def _hmatrix(causal: bool, at: At) -> Run:
    q, k, v = at.qkv(1, 4, 4096, 32)
    return lambda dtype: hmatrix_attention(q.to(dtype), k.to(dtype), v.to(dtype), 16, causal)


def _banded(at: At) -> Run:
    q, k, v = at.qkv(4096, 4, 32)
    return lambda dtype: banded_attention(q.to(dtype), k.to(dtype), v.to(dtype), 64, 64)


def _layer(module: torch.nn.Module, *inputs, at: At, rows: slice = slice(None)) -> Run:
    """``module`` with half parameters, in half precision or as its float64 copy, on
    ``inputs`` (half floats widened with it; other inputs as they are); the output's
    ``rows``."""
    modules = {at.half: module.eval().to(at.device, at.half)}
    modules[torch.float64] = copy.deepcopy(modules[at.half]).double()
    inputs = [x.to(at.device) for x in inputs]

    def run(dtype):
        args = [x.to(dtype) if torch.is_tensor(x) and x.is_floating_point() else x for x in inputs]
        out = modules[dtype](*args)
        return (out[0] if isinstance(out, tuple) else out)[rows]

    return run


def _wide(conv: torch.nn.Module, at: At, n: int = 2048, targets: int = 16) -> Run:
    """``conv`` on a graph where every node is a key of each of the first ``targets`` nodes
    (2,048 incoming edges, as for global tokens); the outputs of those targets."""
    edge_index = torch.stack(
        [torch.arange(n).repeat(targets), torch.arange(targets).repeat_interleave(n)]
    )
    return _layer(conv, at.randn(n, 32, seed=6), edge_index, at=at, rows=slice(0, targets))


def _decode(at: At) -> Run:
    """A hierarchical KV cache of ``dtype`` decoding the 2,048 tokens of a window tree."""
    events = append_schedule(window_hierarchy(2048, (16, 8))).tolist()
    q, k, v = at.qkv(2048, 2, 16)

    def run(dtype):
        cache = HierarchicalKVCache(2, 16, dtype=dtype, device=at.device)
        return torch.stack(
            [cache.append(q[i], k[i], v[i], close=c, open=o) for i, (c, o) in enumerate(events)]
        )

    return run


def _pool(at: At) -> Run:
    tree = window_hierarchy(20000, (16, 8)).to(at.device)
    x = at.randn(20000, 16, seed=0) + 3
    return lambda dtype: hnn.global_leaf_mean_pool(x.to(dtype), tree)


def _ops(at: At) -> dict[str, Callable[[], Run]]:
    return {
        "hierarchical_attention": lambda: _op(hierarchical_attention, at),
        "causal_hierarchical_attention": lambda: _op(causal_hierarchical_attention, at),
        "hmatrix_attention": lambda: _hmatrix(False, at),
        "hmatrix_attention-causal": lambda: _hmatrix(True, at),
        "banded_attention": lambda: _banded(at),
        "HierarchicalKVCache": lambda: _decode(at),
        "global_leaf_mean_pool": lambda: _pool(at),
    }


def _layers(at: At) -> dict[str, Callable[[], Run]]:
    tree = window_hierarchy(4096, (16, 8, 4))
    x, tokens = at.randn(4096, 64, seed=3), at.randn(1, 2048, 64, seed=4)
    sequence = at.randn(1, 1024, 64, seed=5)
    vip = torch.zeros(1, 2048, dtype=torch.bool)
    vip[:, :8] = True
    return {
        "HierarchicalSelfAttention": lambda: _layer(
            hnn.HierarchicalSelfAttention(64, 64, heads=4, hubs=8), x, tree, at=at
        ),
        "HierarchicalTransformerEncoder": lambda: _layer(
            hnn.HierarchicalTransformerEncoder(64, 64, num_layers=2, heads=4), x, tree, at=at
        ),
        "VCCEncoder": lambda: _layer(
            hnn.VCCEncoder(2, 64, 4, block_size=16, num_refined=32), tokens, vip, at=at
        ),
        "HMatrixAttention": lambda: _layer(hnn.HMatrixAttention(64, 4, 16), sequence, at=at),
        "ConeAttention": lambda: _layer(
            hnn.ConeAttention(64, 4), sequence, sequence, sequence, at=at
        ),
        "MaskedAttentionConv": lambda: _wide(hnn.MaskedAttentionConv(32, 8, heads=4), at),
        "ConeConv": lambda: _wide(hnn.ConeConv(32, 8, heads=4), at),
    }


OPS, LAYERS = list(_ops(At("cpu", torch.bfloat16))), list(_layers(At("cpu", torch.bfloat16)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("half", HALVES, ids=str)
@pytest.mark.parametrize("name", OPS + LAYERS)
def test_half_precision_errs_about_one_rounding(name, half, device):
    torch.manual_seed(0)  # the layers' initial weights
    at = At(device, half)
    factor = OP_FACTOR if name in OPS else LAYER_FACTOR
    run = {**_ops(at), **_layers(at)}[name]()
    with torch.no_grad():
        got, want = run(half), run(torch.float64)
    assert got.dtype == half
    assert relative_error(got, want) <= factor * rounding_error(want, half)
