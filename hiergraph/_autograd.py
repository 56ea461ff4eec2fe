"""Autograd helpers: the base of the library's hand-written backward passes, whether an
operation is recorded (the switch of paths that are faster without it), and second
derivatives of a hand-written backward through a recorded twin."""

from __future__ import annotations

import functools

import torch
from torch import Tensor


class AutogradFunction(torch.autograd.Function):
    """The base of every :class:`torch.autograd.Function` of the library.

    Traced by ``torch.compile``, the tensors a ``forward`` returns are handed out as views
    of themselves. In torch 2.11 the compiled backward of a function whose forward writes a
    tensor in place and then returns or saves it gets wrong gradients (zeros, or the
    gradient of another input; pytorch/pytorch#180642, fixed in 2.12), and most forwards
    here finish their outputs in place. A view costs nothing in a compiled graph, and eager
    calls are unchanged."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "forward" in vars(cls):
            cls.forward = staticmethod(_views_when_compiling(vars(cls)["forward"].__func__))


def _views_when_compiling(forward):
    @functools.wraps(forward)
    def wrapped(ctx, *args, **kwargs):
        out = forward(ctx, *args, **kwargs)
        if not torch.compiler.is_compiling():
            return out
        if isinstance(out, tuple):
            return tuple(_view(t) for t in out)
        return _view(out)

    return wrapped


def _view(x):
    return x.view_as(x) if isinstance(x, Tensor) else x


def records_grad(*tensors: Tensor | None) -> bool:
    """Whether an operation on ``tensors`` would be recorded by autograd: grad mode is on and
    one of them (``None`` entries skipped) requires a gradient."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def recorded_gradients(recorded, inputs: tuple, grad) -> tuple:
    """The gradients of ``inputs`` from ``grad`` that a hand-written first-order backward
    returns under ``create_graph=True`` (grad mode is then on in the backward): those
    through ``recorded``, the same op on tensor operations, which carry a graph (second
    derivatives). A backward calls it as ``if torch.is_grad_enabled(): return …,
    *recorded_gradients(…)``.

    ``inputs`` are the op's ``q, k, v`` and position embeddings ``eps`` (a tensor, a list of
    tensors, one per level, or ``None``), the saved inputs of its node, still part of the
    graph; ``recorded(*inputs)`` returns the op's outputs, ``grad`` has one gradient per
    output (a tensor or a tuple). Returns one gradient per tensor argument of the node's
    forward (``q, k, v, eps`` for one embedding or none, ``q, k, v, *eps`` for a list):
    ``None`` for an input that needs none (or is ``None``), zeros for one the outputs do not
    depend on (``q, k`` of one family of two without self energies), as from the
    first-order backward. Outputs that depend on no input that needs a gradient (the sums
    of ``q`` where only the embeddings need one, say), and those without a gradient, are
    left out."""
    tensors = [t for x in inputs for t in (x if isinstance(x, list) else [x])]
    outs = recorded(*inputs)
    outs, grads = (outs, grad) if isinstance(outs, tuple | list) else ((outs,), (grad,))
    pairs = [(o, g) for o, g in zip(outs, grads, strict=True) if o.requires_grad and g is not None]
    wanted = [t for t in tensors if t is not None and t.requires_grad]
    found = [None] * len(wanted)
    if pairs:
        found = torch.autograd.grad(
            [o for o, _ in pairs], wanted, [g for _, g in pairs], create_graph=True,
            allow_unused=True,
        )  # fmt: skip
    found = iter(
        torch.zeros_like(t) if g is None else g for t, g in zip(wanted, found, strict=True)
    )
    return tuple(next(found) if t is not None and t.requires_grad else None for t in tensors)


def differentiable_once(backward):
    """Decorator of a hand-written ``backward`` that has no derivative of its own: run under
    ``create_graph=True`` (grad mode on in a backward), it raises ``RuntimeError`` instead
    of returning gradients without one. PyTorch's ``once_differentiable`` raises only where
    the incoming gradients are recorded, and only in ``Tensor.backward``: the gradient of
    ``out.sum()`` came out as a constant, so a second derivative through it (a gradient
    penalty, a Hessian-vector product) silently lost its terms."""

    @functools.wraps(backward)
    def wrapped(ctx, *grads):
        if torch.is_grad_enabled():  # (a backward runs without grad mode otherwise)
            name = type(ctx).__name__.removesuffix("Backward").lstrip("_")
            raise RuntimeError(
                f"{name} is differentiable once: its gradients have no derivative, so "
                "create_graph=True (second derivatives, gradient penalties) cannot go through "
                "it"
            )
        return backward(ctx, *grads)

    return wrapped
