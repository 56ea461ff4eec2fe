"""Operator calls per forward+backward step of the main ops, against a budget.

On a GPU an eager step of the sizes people run (a few thousand tokens) is launch-bound:
every operator call is at least one kernel launch and costs the host some tens of
microseconds whatever its size (the benchmarks' GPU section). A change that adds calls to
these steps slows them there, and the CPU tests would not notice; these budgets make it
visible. The steps run on the ``meta`` device, which takes the branches taken off the CPU
(on the CPU, the compiled kernel runs most of them in a few calls). The budgets are the
counts measured when they were set: lower is welcome, a higher count needs a reason (then
raise the budget with it).
"""

from __future__ import annotations

import math

import pytest
import torch

from hiergraph.data import window_forest
from hiergraph.data.windows import hmatrix_layout
from hiergraph.ops import causal_hierarchical_attention, hierarchical_attention
from hiergraph.ops.hmatrix import hmatrix_attention
from tests.operators import launches


def _leaves(*shape, heads_first=False, dtype=torch.float32) -> list[torch.Tensor]:
    if heads_first:  # [H, L, d] memory viewed as [L, H, d]
        shape = (shape[1], shape[0], *shape[2:])
        return [
            torch.empty(shape, device="meta", dtype=dtype).transpose(0, 1).requires_grad_()
            for _ in "qkv"
        ]  # fmt: skip
    return [torch.empty(shape, device="meta", dtype=dtype, requires_grad=True) for _ in "qkv"]


def _windows(causal=False):
    """Four window trees of 512 leaves, (16, 8, 4): an equal-fanout forest (or its causal
    plan, built on the CPU, as a training loop builds it once)."""
    index = window_forest([512] * 4, (16, 8, 4)).tree_index()
    return (index.causal_plan if causal else index).to("meta")


def _lengths():
    """Window trees over sequences of different lengths (the padded path, or blocks)."""
    return window_forest([37, 20, 64, 50], (4, 4)).tree_index().to("meta")


CASES = {  # name: (make (fn, leaves), budget)
    "hsa-uniform": (lambda: _hsa(_windows(), _leaves(2048, 4, 16)), 99),
    "hsa-uniform-heads-first": (
        lambda: _hsa(_windows(), _leaves(2048, 4, 16, heads_first=True)),
        92,
    ),
    "hsa-padded": (lambda: _hsa(_lengths(), _leaves(171, 2, 8)), 191),
    "hsa-blocks": (lambda: _hsa(_lengths(), _leaves(171, 2, 8), kernel="blocks"), 475),
    "causal-hsa-uniform": (
        lambda: _hsa(_windows(causal=True), _leaves(2048, 4, 16), causal=True),
        313,
    ),
    "hmatrix": (lambda: _hmatrix(_leaves(1, 4, 512, 16)), 100),
}


def _hsa(index, leaves, causal=False, **options):
    op = causal_hierarchical_attention if causal else hierarchical_attention
    return (lambda: op(*leaves, index, **options)), leaves


def _hmatrix(leaves):
    return (lambda: hmatrix_attention(*leaves, 16)), leaves


@pytest.mark.parametrize("name", list(CASES))
def test_operator_calls_stay_within_budget(name):
    make, budget = CASES[name]
    count, calls = launches(*make())
    assert count <= budget, (
        f"{name}: {count} operator calls per forward+backward, budget {budget}; "
        f"most called: {calls.most_common(8)}"
    )


@pytest.mark.parametrize("branching", [(2,), (4,), (4, 4), (16, 8, 4)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["heads-first", "node-major", "leaf-mask", "padded"])
def test_a_level_costs_a_fixed_number_of_calls(branching, dtype, layout):
    """Equal-fanout HSA is one autograd node with a written backward, bf16 included
    (computed in float32): ``D`` levels (window trees of ``branching``, one root family
    above them) take at most ``14 + 37 D`` calls, and with masked leaves (a leaf mask, or
    the padded path of sequences of different lengths) ``10 + 60 D``."""
    if layout == "padded" and branching == (2,):
        pytest.skip("too short to pad: the block kernel takes it")
    depth, length = len(branching) + 1, 2 * math.prod(branching)
    lengths = [length, length - 3] if layout == "padded" else [length, length]
    index = window_forest(lengths, branching).tree_index().to("meta")
    leaves = _leaves(sum(lengths), 3, 8, heads_first=layout != "node-major", dtype=dtype)
    mask = None
    if layout == "leaf-mask":
        mask = torch.ones(sum(lengths), dtype=torch.bool, device="meta")
    fn, leaves = _hsa(index, leaves, leaf_mask=mask, include_self=True)
    count, calls = launches(fn, leaves)
    budget = 14 + 37 * depth if mask is None and layout != "padded" else 10 + 60 * depth
    assert count <= budget, f"{count} calls, budget {budget}; most: {calls.most_common(8)}"


@pytest.mark.parametrize("length", [512, 2048, 8192, 32768])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("padded", [False, True], ids=["", "padded"])
def test_an_hmatrix_level_costs_a_fixed_number_of_calls(length, causal, padded):
    """H-matrix attention over ``M`` levels takes at most ``50 + 10 M`` calls, and with a
    key padding mask (the counts then made per call, on the device) ``62 + 12 M``: every
    level's coarsening, shift, interpolation and their adjoints are a few in-place
    operations on views of packed buffers."""
    leaves = _leaves(1, 4, length, 16)
    mask = torch.zeros(1, length, dtype=torch.bool, device="meta") if padded else None
    levels = hmatrix_layout(length, 16).num_levels
    count, calls = launches(lambda: hmatrix_attention(*leaves, 16, causal, mask), leaves)
    budget = 62 + 12 * levels if padded else 50 + 10 * levels
    assert count <= budget, f"{count} calls, budget {budget}; most: {calls.most_common(8)}"


def test_the_counter_sees_kernels_and_skips_views():
    x = torch.randn(4, 4, requires_grad=True)
    count, calls = launches(lambda: (x.view(16) * 2).exp(), [x])
    # the forward's product and exp; the backward's products by exp(.) and by 2
    assert "view" not in calls and calls["mul"] == 3 and calls["exp"] == 1
    assert count == sum(calls.values()) > 0
