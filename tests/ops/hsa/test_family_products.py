"""The batched per-family products of equal-fanout HSA (``family_product``,
``family_gram``, ``summed_products``, ``family_sum``) against plain matmuls and sums, with
first and second derivatives."""

import functools

import pytest
import torch

import hiergraph.ops.hsa.family_products as family_products
from tests.conftest import DispatchedOps

F64 = dict(dtype=torch.float64)


@pytest.mark.parametrize("b", [2, 3])
def test_family_product_is_matmul_differentiable_twice(b):
    """Families of two take the multiply-add path on the CPU: equal to ``p @ v``, with first
    and second derivatives."""
    gen = torch.Generator().manual_seed(b)
    p = torch.randn(2, 3, b, b, generator=gen, **F64).requires_grad_()
    v = torch.randn(2, 3, b, 4, generator=gen, **F64).requires_grad_()
    torch.testing.assert_close(family_products.family_product(p, v), p @ v, atol=1e-15, rtol=0)
    assert torch.autograd.gradcheck(family_products.family_product, (p, v))
    assert torch.autograd.gradgradcheck(family_products.family_product, (p, v))


@pytest.mark.parametrize("b", [2, 3])
@pytest.mark.parametrize("rows", [None, 1, 4], ids=["no-base", "broadcast-base", "full-base"])
def test_family_product_with_a_base_is_the_product_plus_base_differentiable_twice(b, rows):
    """``base + alpha * p @ v`` with the sum in the product (``baddbmm``, or the pair
    multiply-adds for ``b = 2``), a base that broadcasts over rows included."""
    gen = torch.Generator().manual_seed(10 * b + (rows or 0))
    p = torch.randn(2, 3, 4, b, generator=gen, **F64).requires_grad_()
    v = torch.randn(2, 3, b, 5, generator=gen, **F64).requires_grad_()
    inputs = [p, v]
    if rows is not None:
        inputs.append(torch.randn(2, 3, rows, 5, generator=gen, **F64).requires_grad_())

    def fn(p, v, base=None):
        return family_products.family_product(p, v, base, alpha=0.5)

    want = 0.5 * (p @ v) + (0 if rows is None else inputs[2])
    torch.testing.assert_close(fn(*inputs), want, atol=1e-15, rtol=0)
    assert torch.autograd.gradcheck(fn, tuple(inputs))
    assert torch.autograd.gradgradcheck(fn, tuple(inputs), fast_mode=True)


@pytest.mark.parametrize("b", [3, 4])
@pytest.mark.parametrize("families", [4, 6, 20], ids=lambda f: f"{f}-families")
def test_family_gram_is_the_product_with_the_transpose_differentiable_twice(
    b, families, monkeypatch
):
    """``alpha * x @ y^T`` per family; families of 4 are taken four at a time (one
    ``[16, c] @ [c, 16]`` product per group, its diagonal blocks; here from any count on), a
    single group included; families of 3 and counts that are no multiple of four take one
    batched product. With first and second derivatives."""
    monkeypatch.setattr(family_products, "GRAM_MIN_FAMILIES", 1)
    gen = torch.Generator().manual_seed(families * b)
    x, y = (torch.randn(families, b, 6, generator=gen, **F64).requires_grad_() for _ in "xy")

    def fn(x, y):
        return family_products.family_gram(x, y, alpha=0.5)

    with DispatchedOps() as ops:
        out = fn(x, y)
    grouped = b == 4 and families % 4 == 0
    assert ops.shapes("bmm") == [(families // 4, 16, 6) if grouped else (families, b, 6)]
    torch.testing.assert_close(out, 0.5 * x @ y.mT, atol=1e-15, rtol=0)
    assert torch.autograd.gradcheck(fn, (x, y))
    assert torch.autograd.gradgradcheck(fn, (x, y))


def test_summed_products_are_the_sum_of_the_products_differentiable_twice():
    """Terms over the same 12 rows grouped into families of different sizes (families of
    two included) accumulate into one ``[H, L, d]`` result, with first and second
    derivatives; a transposed output gradient gives the same gradients as a contiguous one."""
    gen = torch.Generator().manual_seed(11)
    terms = [(1, 12, 3), (3, 4, 2), (6, 2, 4)]  # (families, rows per family, keys)
    inputs = []
    for families, rows, keys in terms:
        inputs.append(torch.randn(2, families, rows, keys, generator=gen, **F64))
        inputs.append(torch.randn(2, families, keys, 5, generator=gen, **F64))
    inputs = [t.requires_grad_() for t in inputs]

    def fn(*flat):
        return family_products.summed_products(list(zip(flat[::2], flat[1::2], strict=True)))

    want = sum((p @ v).flatten(1, 2) for p, v in zip(inputs[::2], inputs[1::2], strict=True))
    out = fn(*inputs)
    torch.testing.assert_close(out, want, atol=1e-14, rtol=0)  # summed in another order
    grad = torch.randn(12, 2, 5, generator=gen, **F64).transpose(0, 1)
    got = torch.autograd.grad(out, inputs, grad)
    for a, b in zip(got, torch.autograd.grad(want, inputs, grad.contiguous()), strict=True):
        torch.testing.assert_close(a, b, atol=1e-14, rtol=0)
    assert torch.autograd.gradcheck(fn, tuple(inputs))
    assert torch.autograd.gradgradcheck(fn, tuple(inputs), fast_mode=True)


@pytest.mark.parametrize("b", [2, 3])
def test_family_sum_is_the_member_sum_differentiable_twice(b):
    """Families of two take the one-add path on the CPU: equal to ``sum(-2)``, with first
    and second derivatives."""
    x = torch.randn(2, 3, b, 4, generator=torch.Generator().manual_seed(b), **F64)
    x.requires_grad_()
    torch.testing.assert_close(family_products.family_sum(x), x.sum(-2), atol=1e-15, rtol=0)
    assert torch.autograd.gradcheck(family_products.family_sum, (x,))
    assert torch.autograd.gradgradcheck(family_products.family_sum, (x,))


@pytest.mark.parametrize("b", [2, 3])
def test_family_sum_accumulates_in_the_given_dtype(b):
    """Half-precision members are summed in float32, and their gradient comes back in
    their own dtype."""
    x = torch.full((3, b, 2), 2048.0, dtype=torch.float16, requires_grad=True)
    x.data[:, 1:] = 1.0  # 2048 + 1 rounds to 2048 in float16
    total = family_products.family_sum(x, torch.float32)
    assert total.dtype == torch.float32
    assert (total == 2048.0 + (b - 1)).all()
    total.sum().backward()
    assert x.grad.dtype == torch.float16 and (x.grad == 1).all()


def test_off_the_cpu_families_of_two_and_of_four_run_as_batched_products():
    """Off the CPU (the ``meta`` device: shapes only) families of two take the batched
    products and the plain member sum, not the CPU's multiply-adds, and 1,024 families of
    4 take one batch of ``[4, c] @ [c, 4]`` products, not the CPU's blocks of four, forward
    and backward, in the shapes the CPU gives."""
    rand = functools.partial(torch.randn, device="meta", requires_grad=True)
    p2, v2, base = rand(2, 6, 3, 2), rand(2, 6, 2, 5), rand(2, 6, 1, 5)
    p3, v3 = rand(2, 2, 9, 3), rand(2, 2, 3, 5)
    x = rand(1024, 4, 8)
    with DispatchedOps() as ops:
        outputs = [
            family_products.family_product(p2, v2),
            family_products.family_product(p2, v2, base, alpha=0.5),
            family_products.summed_products([(p3, v3), (p2, v2)]),  # the second accumulates
            family_products.family_sum(v2),
            family_products.family_gram(x, x),
        ]
        grads = torch.autograd.grad(sum(o.sum() for o in outputs), [p2, v2, base, p3, v3, x])
    shapes = [(2, 6, 3, 5), (2, 6, 3, 5), (2, 18, 5), (2, 6, 5), (1024, 4, 4)]
    assert [tuple(o.shape) for o in outputs] == shapes
    assert [g.shape for g in grads] == [t.shape for t in (p2, v2, base, p3, v3, x)]
    names = {name for name, _ in ops.calls}
    assert "addcmul" not in names and "addcmul_" not in names  # the pairs' multiply-adds
    assert (2, 6, 2, 5) in ops.shapes("sum")  # the member sum of v2 (the loss sums too)
    assert (1024, 4, 8) in ops.shapes("bmm")  # one batch of the families, not [256, 16, 8]
