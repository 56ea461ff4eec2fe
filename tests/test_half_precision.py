"""Every op and layer in bfloat16 errs about as much as one rounding of its float64 result.

Each case runs once in bf16 and once in float64 on the same values (the bf16 inputs and
parameters, widened), at sizes where a sum kept in bf16 would show: thousands of leaves,
tokens or incoming edges. Ops must stay within 1.5 times the relative error of rounding the
float64 output to bf16 (they compute in float32 and round once); layers within 4 times
(their projections, norms and residuals round in bf16 too; a stack of two PyTorch
transformer layers lands at about 3). Half-precision sums that stall, scores that tie and
rounded logits cost far more; before they were taken in float32, these cases measured 3–5
times one rounding for H-matrix attention, 18 for the VCC encoder (its selection scores
tied), 4 for the KV cache after 2,048 tokens (170 after 4,096) and 276 for masked
attention, whose softmax summed 2,048 weights in bf16.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

from hiergraph import nn as hnn
from hiergraph.data import window_hierarchy
from hiergraph.nn.kv_cache import HierarchicalKVCache, append_schedule
from hiergraph.ops import (
    banded_attention,
    causal_hierarchical_attention,
    hierarchical_attention,
    hmatrix_attention,
)

OP_FACTOR, LAYER_FACTOR = 1.5, 4.0
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))]  # fmt: skip

#: ``run(dtype)``: a case's output computed in ``dtype`` (bf16 or float64)
Run = Callable[[torch.dtype], torch.Tensor]


def _randn(*shape: int, seed: int, device: str) -> torch.Tensor:
    """A bf16 tensor of standard normal values on ``device``."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return x.bfloat16().to(device)


def _qkv(shape: tuple[int, ...], device: str) -> list[torch.Tensor]:
    return [_randn(*shape, seed=i, device=device) for i in range(3)]


def _op(fn: Callable, device: str) -> Run:
    """``fn(q, k, v, tree)`` on ``[L, H, d]`` rows over a 4,096-leaf window tree."""
    tree = window_hierarchy(4096, (16, 8, 4)).to(device)
    q, k, v = _qkv((4096, 4, 32), device)
    return lambda dtype: fn(q.to(dtype), k.to(dtype), v.to(dtype), tree)


def _hmatrix(causal: bool, device: str) -> Run:
    q, k, v = _qkv((1, 4, 4096, 32), device)
    return lambda dtype: hmatrix_attention(q.to(dtype), k.to(dtype), v.to(dtype), 16, causal)


def _banded(device: str) -> Run:
    q, k, v = _qkv((4096, 4, 32), device)
    return lambda dtype: banded_attention(q.to(dtype), k.to(dtype), v.to(dtype), 64, 64)


def _layer(module: torch.nn.Module, *inputs, device: str, rows: slice = slice(None)) -> Run:
    """``module`` with bf16 parameters, in bf16 or as its float64 copy, on ``inputs`` (bf16
    floats widened with it; other inputs as they are); the output's ``rows``."""
    modules = {torch.bfloat16: module.eval().bfloat16().to(device)}
    modules[torch.float64] = copy.deepcopy(modules[torch.bfloat16]).double()
    inputs = [x.to(device) for x in inputs]

    def run(dtype):
        args = [x.to(dtype) if torch.is_tensor(x) and x.is_floating_point() else x for x in inputs]
        out = modules[dtype](*args)
        return (out[0] if isinstance(out, tuple) else out)[rows]

    return run


def _wide(conv: torch.nn.Module, device: str, n: int = 2048, targets: int = 16) -> Run:
    """``conv`` on a graph where every node is a key of each of the first ``targets`` nodes
    (2,048 incoming edges, as for global tokens); the outputs of those targets."""
    edge_index = torch.stack(
        [torch.arange(n).repeat(targets), torch.arange(targets).repeat_interleave(n)]
    )
    x = _randn(n, 32, seed=6, device=device)
    return _layer(conv, x, edge_index, device=device, rows=slice(0, targets))


def _decode(device: str) -> Run:
    """A hierarchical KV cache of ``dtype`` decoding the 2,048 tokens of a window tree."""
    events = append_schedule(window_hierarchy(2048, (16, 8))).tolist()
    q, k, v = _qkv((2048, 2, 16), device)

    def run(dtype):
        cache = HierarchicalKVCache(2, 16, dtype=dtype, device=device)
        return torch.stack(
            [cache.append(q[i], k[i], v[i], close=c, open=o) for i, (c, o) in enumerate(events)]
        )

    return run


def _pool(device: str) -> Run:
    tree = window_hierarchy(20000, (16, 8)).to(device)
    x = _randn(20000, 16, seed=0, device=device) + 3
    return lambda dtype: hnn.global_leaf_mean_pool(x.to(dtype), tree)


def _encoders(device: str) -> dict[str, Callable[[], Run]]:
    tree = window_hierarchy(4096, (16, 8, 4))
    x = _randn(4096, 64, seed=3, device=device)
    tokens = _randn(1, 2048, 64, seed=4, device=device)
    sequence = _randn(1, 1024, 64, seed=5, device=device)
    vip = torch.zeros(1, 2048, dtype=torch.bool)
    vip[:, :8] = True
    return {
        "HierarchicalSelfAttention": lambda: _layer(
            hnn.HierarchicalSelfAttention(64, 64, heads=4, hubs=8), x, tree, device=device
        ),
        "HierarchicalTransformerEncoder": lambda: _layer(
            hnn.HierarchicalTransformerEncoder(64, 64, num_layers=2, heads=4),
            x,
            tree,
            device=device,
        ),
        "VCCEncoder": lambda: _layer(
            hnn.VCCEncoder(2, 64, 4, block_size=16, num_refined=32), tokens, vip, device=device
        ),
        "HMatrixAttention": lambda: _layer(
            hnn.HMatrixAttention(64, 4, 16), sequence, device=device
        ),
        "ConeAttention": lambda: _layer(
            hnn.ConeAttention(64, 4), sequence, sequence, sequence, device=device
        ),
        "MaskedAttentionConv": lambda: _wide(hnn.MaskedAttentionConv(32, 8, heads=4), device),
        "ConeConv": lambda: _wide(hnn.ConeConv(32, 8, heads=4), device),
    }


def _ops(device: str) -> dict[str, Callable[[], Run]]:
    return {
        "hierarchical_attention": lambda: _op(hierarchical_attention, device),
        "causal_hierarchical_attention": lambda: _op(causal_hierarchical_attention, device),
        "hmatrix_attention": lambda: _hmatrix(False, device),
        "hmatrix_attention-causal": lambda: _hmatrix(True, device),
        "banded_attention": lambda: _banded(device),
        "HierarchicalKVCache": lambda: _decode(device),
        "global_leaf_mean_pool": lambda: _pool(device),
    }


OPS, LAYERS = list(_ops("cpu")), list(_encoders("cpu"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS + LAYERS)
def test_bf16_errs_about_one_rounding(name, device):
    torch.manual_seed(0)  # the layers' initial weights
    factor = OP_FACTOR if name in OPS else LAYER_FACTOR
    run = {**_ops(device), **_encoders(device)}[name]()
    with torch.no_grad():
        got, want = run(torch.bfloat16), run(torch.float64)

    def error(x):
        return ((x.double() - want).norm() / want.norm()).item()

    assert got.dtype == torch.bfloat16
    assert error(got) <= factor * error(want.to(torch.bfloat16))
