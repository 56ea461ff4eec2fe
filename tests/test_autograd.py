import importlib
import inspect
import pkgutil

import pytest
import torch

import hiergraph
from hiergraph._autograd import AutogradFunction, records_grad
from hiergraph.data import window_forest
from hiergraph.ops import hierarchical_attention


def test_records_grad_needs_grad_mode_and_a_tensor_that_requires_it():
    x, w = torch.zeros(2), torch.zeros(2, requires_grad=True)
    assert records_grad(x, None, w) and not records_grad(x, None)
    with torch.no_grad():
        assert not records_grad(w)
    with torch.inference_mode():
        assert not records_grad(w)


def _library_functions() -> list[type]:
    """Every ``torch.autograd.Function`` subclass defined in the library's modules."""
    found = []
    for module in pkgutil.walk_packages(hiergraph.__path__, "hiergraph."):
        if module.name.endswith("__main__"):  # (runs the command line on pytest's arguments)
            continue
        try:
            loaded = importlib.import_module(module.name)
        except ImportError:  # an optional dependency (transformers, triton, ...)
            continue
        for obj in vars(loaded).values():
            if (
                inspect.isclass(obj)
                and issubclass(obj, torch.autograd.Function)
                and obj.__module__ == loaded.__name__
            ):
                found.append(obj)
    return found


def test_every_function_of_the_library_derives_from_the_compile_safe_base():
    """Its forward's outputs are views under ``torch.compile`` (torch 2.11 computes wrong
    gradients for forwards that return tensors they wrote in place)."""
    functions = [f for f in _library_functions() if f is not AutogradFunction]
    assert len(functions) >= 25
    assert [f.__qualname__ for f in functions if not issubclass(f, AutogradFunction)] == []


class _Doubled(AutogradFunction):
    @staticmethod
    def forward(ctx, x):
        out = x.clone()
        return out.mul_(2), x.sum()

    @staticmethod
    def backward(ctx, grad, grad_sum):
        return 2 * grad + grad_sum


def test_forward_outputs_are_views_when_compiling_only():
    x = torch.arange(3.0, requires_grad=True)
    out, total = _Doubled.apply(x)
    assert out._base is None and total._base is None  # eager: the tensors themselves
    seen = []

    def spy(x):
        out, total = _Doubled.apply(x)
        seen.append(out._base is not None)
        return out.sum() + total

    torch.compile(spy, backend="eager", fullgraph=True)(x).backward()
    assert x.grad.tolist() == [3.0, 3.0, 3.0]
    assert seen == [True]  # traced: a view of the forward's output


@pytest.mark.parametrize("kernel", ["blocks", "edge", "dense"])
@pytest.mark.parametrize("wanted", [("pos",), ("q",), ("v",), ("q", "k")])
def test_second_derivatives_of_some_inputs_only(kernel, wanted):
    """Second derivatives through the recorded op (``recorded_gradients``) where only some
    inputs need a gradient: outputs that depend on none of them (the sums of ``q`` where
    only the embeddings need one) were handed to ``autograd.grad``, which refused them.
    Window trees of two lengths: padded to equal fanout with ``"dense"``."""
    forest = window_forest([4, 6], (2, 2))
    gen = torch.Generator().manual_seed(0)
    tensors = {
        name: torch.randn(*shape, generator=gen, dtype=torch.float64)
        for name, shape in (("q", (10, 2, 3)), ("k", (10, 2, 3)), ("v", (10, 2, 2)),
                            ("pos", (forest.num_nodes, 2, 2)))
    }  # fmt: skip

    def attend(*args):
        t = tensors | dict(zip(wanted, args, strict=True))
        return hierarchical_attention(
            t["q"], t["k"], t["v"], forest, pos_emb=t["pos"], include_self=True, kernel=kernel
        )

    inputs = [tensors[name].requires_grad_() for name in wanted]
    assert torch.autograd.gradgradcheck(attend, inputs, fast_mode=True)


@pytest.mark.parametrize("op", ["hmatrix", "banded", "penumbral_edge"])
def test_hand_written_backwards_refuse_create_graph(op):
    """Gradients with ``create_graph=True`` came back as constants (``once_differentiable``
    marks them only where the incoming gradient is recorded): a gradient penalty through
    them lost its terms without an error (0.0 instead of 0.138 for H-matrix attention)."""
    from hiergraph.ops import banded_attention, hmatrix_attention, penumbral_edge

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1, 10, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    edges = torch.tensor([[0, 1, 2, 3, 4, 0, 2], [0, 0, 1, 2, 3, 3, 1]])
    run = {
        "hmatrix": lambda: hmatrix_attention(x, x, x, 2),
        "banded": lambda: banded_attention(
            x[0, 0, :, None], x[0, 0, :, None], x[0, 0, :, None], 2, 2
        ),
        "penumbral_edge": lambda: penumbral_edge(x[0, 0, :5], x[0, 0, :5], edges),
    }[op]
    (first,) = torch.autograd.grad(run().square().sum(), x)  # first order: as before
    assert torch.isfinite(first).all()
    with pytest.raises(RuntimeError, match="differentiable once"):
        torch.autograd.grad(run().square().sum(), x, create_graph=True)
