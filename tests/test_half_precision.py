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


def _randn(*shape: int, seed: int) -> torch.Tensor:
    """A bf16 tensor of standard normal values."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


def _qkv(shape: tuple[int, ...]) -> list[torch.Tensor]:
    return [_randn(*shape, seed=i) for i in range(3)]


def _op(fn: Callable) -> Callable[[torch.dtype], torch.Tensor]:
    """A case of ``fn(q, k, v)`` on ``[L, H, d]`` rows over a 4,096-leaf window tree."""
    tree = window_hierarchy(4096, (16, 8, 4))
    q, k, v = _qkv((4096, 4, 32))
    return lambda dtype: fn(q.to(dtype), k.to(dtype), v.to(dtype), tree)


def _hmatrix(causal: bool) -> Callable[[torch.dtype], torch.Tensor]:
    q, k, v = _qkv((1, 4, 4096, 32))
    return lambda dtype: hmatrix_attention(q.to(dtype), k.to(dtype), v.to(dtype), 16, causal)


def _banded() -> Callable[[torch.dtype], torch.Tensor]:
    q, k, v = _qkv((4096, 4, 32))
    return lambda dtype: banded_attention(q.to(dtype), k.to(dtype), v.to(dtype), 64, 64)


def _layer(
    module: torch.nn.Module, *inputs, rows: slice = slice(None)
) -> Callable[[torch.dtype], torch.Tensor]:
    """``module`` with bf16 parameters, in bf16 or as its float64 copy, on ``inputs`` (bf16
    floats widened with it; other inputs as they are); the output's ``rows``."""
    modules = {torch.bfloat16: module.eval().bfloat16()}
    modules[torch.float64] = copy.deepcopy(modules[torch.bfloat16]).double()

    def run(dtype):
        args = [x.to(dtype) if torch.is_tensor(x) and x.is_floating_point() else x for x in inputs]
        out = modules[dtype](*args)
        return (out[0] if isinstance(out, tuple) else out)[rows]

    return run


def _wide(conv: torch.nn.Module, x: torch.Tensor, targets: int = 16) -> Callable:
    """``conv`` on a graph where every node is a key of each of the first ``targets`` nodes
    (2,048 incoming edges, as for global tokens); the outputs of those targets."""
    n = x.size(0)
    edge_index = torch.stack(
        [torch.arange(n).repeat(targets), torch.arange(targets).repeat_interleave(n)]
    )
    return _layer(conv, x, edge_index, rows=slice(0, targets))


def _decode() -> Callable[[torch.dtype], torch.Tensor]:
    """A hierarchical KV cache of ``dtype`` decoding the 2,048 tokens of a window tree."""
    tree = window_hierarchy(2048, (16, 8))
    q, k, v = _qkv((2048, 2, 16))
    events = append_schedule(tree).tolist()

    def run(dtype):
        cache = HierarchicalKVCache(2, 16, dtype=dtype)
        return torch.stack(
            [cache.append(q[i], k[i], v[i], close=c, open=o) for i, (c, o) in enumerate(events)]
        )

    return run


def _pool() -> Callable[[torch.dtype], torch.Tensor]:
    tree = window_hierarchy(20000, (16, 8))
    x = _randn(20000, 16, seed=0) + 3
    return lambda dtype: hnn.global_leaf_mean_pool(x.to(dtype), tree)


def _cases() -> dict[str, tuple[float, Callable[[], Callable[[torch.dtype], torch.Tensor]]]]:
    tree = window_hierarchy(4096, (16, 8, 4))
    x, tokens = _randn(4096, 64, seed=3), _randn(1, 2048, 64, seed=4)
    vip = torch.zeros(1, 2048, dtype=torch.bool)
    vip[:, :8] = True
    sequence = _randn(1, 1024, 64, seed=5)
    nodes = _randn(2048, 32, seed=6)
    return {
        "hierarchical_attention": (OP_FACTOR, lambda: _op(hierarchical_attention)),
        "causal_hierarchical_attention": (OP_FACTOR, lambda: _op(causal_hierarchical_attention)),
        "hmatrix_attention": (OP_FACTOR, lambda: _hmatrix(False)),
        "hmatrix_attention-causal": (OP_FACTOR, lambda: _hmatrix(True)),
        "banded_attention": (OP_FACTOR, _banded),
        "HierarchicalKVCache": (OP_FACTOR, _decode),
        "global_leaf_mean_pool": (OP_FACTOR, _pool),
        "HierarchicalSelfAttention": (
            LAYER_FACTOR,
            lambda: _layer(hnn.HierarchicalSelfAttention(64, 64, heads=4, hubs=8), x, tree),
        ),
        "HierarchicalTransformerEncoder": (
            LAYER_FACTOR,
            lambda: _layer(
                hnn.HierarchicalTransformerEncoder(64, 64, num_layers=2, heads=4), x, tree
            ),
        ),
        "VCCEncoder": (
            LAYER_FACTOR,
            lambda: _layer(hnn.VCCEncoder(2, 64, 4, block_size=16, num_refined=32), tokens, vip),
        ),
        "HMatrixAttention": (
            LAYER_FACTOR,
            lambda: _layer(hnn.HMatrixAttention(64, 4, 16), sequence),
        ),
        "ConeAttention": (
            LAYER_FACTOR,
            lambda: _layer(hnn.ConeAttention(64, 4), sequence, sequence, sequence),
        ),
        "MaskedAttentionConv": (
            LAYER_FACTOR,
            lambda: _wide(hnn.MaskedAttentionConv(32, 8, heads=4), nodes),
        ),
        "ConeConv": (LAYER_FACTOR, lambda: _wide(hnn.ConeConv(32, 8, heads=4), nodes)),
    }


CASES = _cases()


@pytest.mark.parametrize("name", CASES)
def test_bf16_errs_about_one_rounding(name):
    factor, make = CASES[name]
    torch.manual_seed(0)  # the layers' initial weights
    run = make()
    with torch.no_grad():
        got, want = run(torch.bfloat16), run(torch.float64)

    def error(x):
        return ((x.double() - want).norm() / want.norm()).item()

    assert got.dtype == torch.bfloat16
    assert error(got) <= factor * error(want.to(torch.bfloat16))
