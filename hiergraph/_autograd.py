"""Autograd helpers: whether an operation is recorded (the switch of paths that are faster
without it), and second derivatives of a hand-written backward through a recorded twin."""

from __future__ import annotations

import torch
from torch import Tensor


def records_grad(*tensors: Tensor | None) -> bool:
    """Whether an operation on ``tensors`` would be recorded by autograd: grad mode is on and
    one of them (``None`` entries skipped) requires a gradient."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def recorded_gradients(recorded, inputs: tuple[Tensor, ...], grad) -> tuple:
    """The gradients of ``inputs`` (``q, k, v`` and the position embeddings, the saved
    inputs of a node, still part of the graph) from ``grad`` (one per output of the op: a
    tensor or a tuple) through the recorded op, ``recorded(q, k, v, eps)`` (``eps`` a list
    of the embeddings, or ``None``), with a graph (``create_graph=True``): ``None`` for an
    input that needs none, zeros for one the output does not depend on (``q, k`` of one
    family of two without self energies), as from the first-order backward."""
    out = recorded(*inputs[:3], list(inputs[3:]) or None)
    wanted = [t for t in inputs if t.requires_grad]
    found = torch.autograd.grad(out, wanted, grad, create_graph=True, allow_unused=True)
    found = iter(
        torch.zeros_like(t) if g is None else g for t, g in zip(wanted, found, strict=True)
    )
    return tuple(next(found) if t.requires_grad else None for t in inputs)
