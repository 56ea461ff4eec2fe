"""Operator calls per forward+backward step of the main ops, against a budget.

On a GPU an eager step of the sizes people run (a few thousand tokens) is launch-bound:
every operator call is at least one kernel launch and costs the host some tens of
microseconds whatever its size (the benchmarks' GPU section). A change that adds calls to
these steps slows them there, and the CPU tests would not notice; these budgets make it
visible. The budgets are the counts measured when they were set: lower is welcome, a
higher count needs a reason (then raise the budget with it).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hiergraph.data import window_forest
from hiergraph.ops import causal_hierarchical_attention, hierarchical_attention
from hiergraph.ops.hmatrix import hmatrix_attention

#: operators that make views or read metadata: no kernel
VIEWS = {
    "alias", "as_strided", "detach", "diagonal", "expand", "expand_as", "flatten",
    "lift_fresh", "narrow", "permute", "promote_types", "reshape", "select", "slice",
    "split", "split_with_sizes", "squeeze", "t", "transpose", "unbind", "unflatten",
    "unfold", "unsqueeze", "view", "view_as", "_unsafe_view",
}  # fmt: skip


class _Operators(TorchDispatchMode):
    """Counts the calls of every operator."""

    def __init__(self):
        super().__init__()
        self.calls = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def launches(fn, leaves: list[torch.Tensor]) -> tuple[int, Counter]:
    """Non-view operator calls of one forward and ``out.sum().backward()`` of ``fn`` (after
    a warm-up step, so that plans built on first use are not counted)."""

    def step():
        for t in leaves:
            t.grad = None
        fn().sum().backward()

    step()
    with _Operators() as ops:
        step()
    calls = Counter({name: n for name, n in ops.calls.items() if name not in VIEWS})
    return sum(calls.values()), calls


def _leaves(*shape, heads_first=False) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    if heads_first:  # [H, L, d] memory viewed as [L, H, d]
        return [
            torch.randn(shape[1], shape[0], shape[2], generator=gen).transpose(0, 1)
            .requires_grad_() for _ in "qkv"
        ]  # fmt: skip
    return [torch.randn(*shape, generator=gen, requires_grad=True) for _ in "qkv"]


def _windows():
    """Four window trees of 512 leaves, (16, 8, 4): an equal-fanout forest."""
    return window_forest([512] * 4, (16, 8, 4)).tree_index()


def _lengths():
    """Window trees over sequences of different lengths (the padded path, or blocks)."""
    return window_forest([37, 20, 64, 50], (4, 4)).tree_index()


CASES = {  # name: (make (fn, leaves), budget)
    "hsa-uniform": (lambda: _hsa(_windows(), _leaves(2048, 4, 16)), 183),
    "hsa-uniform-heads-first": (
        lambda: _hsa(_windows(), _leaves(2048, 4, 16, heads_first=True)),
        156,
    ),
    "hsa-padded": (lambda: _hsa(_lengths(), _leaves(171, 2, 8)), 291),
    "hsa-blocks": (lambda: _hsa(_lengths(), _leaves(171, 2, 8), kernel="blocks"), 475),
    "causal-hsa-uniform": (lambda: _hsa(_windows(), _leaves(2048, 4, 16), causal=True), 346),
    "hmatrix": (lambda: _hmatrix(_leaves(1, 4, 512, 16)), 214),
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


def test_the_counter_sees_kernels_and_skips_views():
    x = torch.randn(4, 4, requires_grad=True)
    count, calls = launches(lambda: (x.view(16) * 2).exp(), [x])
    # the forward's product and exp; the backward's products by exp(.) and by 2
    assert "view" not in calls and calls["mul"] == 3 and calls["exp"] == 1
    assert count == sum(calls.values()) > 0
