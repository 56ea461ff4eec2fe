"""Counting the operator calls of a step, for the launch-budget tests and the tests of
what a step writes.

On a GPU an eager step of the sizes people run is launch-bound: every operator call that
is not a view is at least one kernel launch. :class:`Operators` records the calls that
reach the dispatcher; :func:`launches` counts those of one forward+backward step. Run on
the ``meta`` device (tensors with shapes and no data), a step takes the branches it takes
off the CPU, so the count is that of an accelerator. :class:`LargeWrites` records the calls
that write a large output (the passes over whole levels, or only the copies).
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


class LargeWrites(TorchDispatchMode):
    """Records the operations whose output holds ``size`` or more elements: with ``only``,
    those of these names; else all but views and allocations (the passes over whole
    levels)."""

    FREE = {"transpose", "view", "_unsafe_view", "expand", "detach", "unsqueeze", "diagonal",
            "new_empty", "new_empty_strided", "empty_like", "randn_like"}  # fmt: skip
    COPIES = ("copy_", "clone", "_to_copy")

    def __init__(self, size: int, only: tuple[str, ...] | None = None):
        super().__init__()
        self.size, self.only, self.names = size, only, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        counted = name in self.only if self.only else name not in self.FREE
        if counted and isinstance(out, torch.Tensor) and out.numel() >= self.size:
            self.names.append(name)
        return out


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
