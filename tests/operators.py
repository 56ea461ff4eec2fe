"""Counting the operator calls of a step, for the launch-budget tests.

On a GPU an eager step of the sizes people run is launch-bound: every operator call that
is not a view is at least one kernel launch. :class:`Operators` records the calls that
reach the dispatcher; :func:`launches` counts those of one forward+backward step. Run on
the ``meta`` device (tensors with shapes and no data), a step takes the branches it takes
off the CPU, so the count is that of an accelerator.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: operators that make views or read metadata: no kernel
VIEWS = {
    "alias", "as_strided", "detach", "diagonal", "expand", "expand_as", "flatten",
    "lift_fresh", "narrow", "permute", "promote_types", "reshape", "select", "slice",
    "split", "split_with_sizes", "squeeze", "t", "transpose", "unbind", "unflatten",
    "unfold", "unsqueeze", "view", "view_as", "_unsafe_view",
}  # fmt: skip


class Operators(TorchDispatchMode):
    """Counts the calls of every operator (by name) within the block."""

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
    with Operators() as ops:
        step()
    calls = Counter({name: n for name, n in ops.calls.items() if name not in VIEWS})
    return sum(calls.values()), calls
