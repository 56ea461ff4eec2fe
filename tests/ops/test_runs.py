"""Run sums and their adjoint broadcast, over tree index levels and over plain runs."""

import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import SignalHierarchy, from_nested, window_hierarchy
from hiergraph.ops.runs import (
    INDEX_ADD_MIN_WIDTH,
    broadcast_runs,
    broadcast_to_children,
    sum_children,
    sum_runs,
)

#: Row shapes below and at the width from which the CPU sums with ``index_add``.
ROWS = [(2,), (INDEX_ADD_MIN_WIDTH,), (4, INDEX_ADD_MIN_WIDTH // 4 + 3)]


def test_sum_children_and_broadcast_are_adjoint():
    h = Batch.from_data_list([from_nested([[0, 1, 2], 3, [[4], 5]]), window_hierarchy(7, (3,))])
    idx = h.tree_index()
    gen = torch.Generator().manual_seed(0)
    for d in range(1, idx.num_levels):
        child, parent = idx.levels[d], idx.levels[d - 1]
        x = torch.randn(child.size, 2, generator=gen, dtype=torch.float64, requires_grad=True)
        y = torch.randn(parent.size, 2, generator=gen, dtype=torch.float64, requires_grad=True)
        summed = sum_children(x, child, parent)
        expected = torch.zeros(parent.size, 2, dtype=torch.float64)
        expected.index_add_(0, child.parent_local, x.detach())
        assert torch.allclose(summed, expected)
        spread = broadcast_to_children(y, child, parent)
        assert torch.equal(spread, y[child.parent_local])
        assert torch.allclose((summed * y).sum(), (x * spread).sum())  # <Sx, y> = <x, S^T y>
        assert torch.autograd.gradcheck(sum_children, (x, child, parent))
        assert torch.autograd.gradcheck(broadcast_to_children, (y, child, parent))


@pytest.mark.parametrize("row", ROWS)
def test_plain_runs_with_empty_ones(row):
    lengths = torch.tensor([2, 0, 3, 1])
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, *row, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, *row, generator=gen, dtype=torch.float64, requires_grad=True)
    expected = torch.stack([x[:2].sum(0), x[:0].sum(0), x[2:5].sum(0), x[5:].sum(0)])
    torch.testing.assert_close(sum_runs(x, lengths), expected, atol=1e-15, rtol=0)
    assert torch.equal(broadcast_runs(y, lengths), y[torch.tensor([0, 0, 2, 2, 2, 3])])
    for fn, t in ((lambda t: sum_runs(t, lengths), x), (lambda t: broadcast_runs(t, lengths), y)):
        assert torch.autograd.gradcheck(fn, (t,))
        assert torch.autograd.gradgradcheck(fn, (t,))


def test_wide_rows_sum_in_row_order():
    """The CPU's ``index_add`` for wide rows adds each run's rows in order, as
    ``segment_reduce`` does for narrow ones: the same bits, whatever the width."""
    lengths = torch.tensor([5, 0, 7, 1, 3])
    x = torch.randn(16, 3, INDEX_ADD_MIN_WIDTH, generator=torch.Generator().manual_seed(2))
    wide = sum_runs(x, lengths)
    narrow = torch.stack(
        [sum_runs(x[:, :, c : c + 1], lengths)[..., 0] for c in range(x.size(2))], -1
    )
    assert torch.equal(wide, narrow)
    assert torch.equal(wide, sum_runs(x, lengths))  # deterministic


@pytest.mark.parametrize("row", ROWS[::2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_child_sums_of_half_inputs_accumulate_in_float32(dtype, row):
    """Families of 600 children: the sums (and the broadcast's backward) are accumulated
    in float32 and rounded once to ``dtype`` (a half-precision running sum stalls at 256)."""
    index = SignalHierarchy.from_parent([-1, 0, 0] + [1] * 600 + [2] * 600).tree_index()
    level, parent_level = index.levels[2], index.levels[1]
    ones = torch.ones(1200, dtype=dtype)
    assert sum_children(ones, level, parent_level).tolist() == [600.0, 600.0]
    x = (torch.rand(1200, *row, generator=torch.Generator().manual_seed(0)) + 0.5).to(dtype)
    ref = x.double().view(2, 600, *row).sum(1)
    out = sum_children(x, level, parent_level)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref, rtol=8e-3, atol=0)
    y = torch.zeros(2, *row, dtype=dtype, requires_grad=True)
    broadcast_to_children(y, level, parent_level).backward(x)
    assert y.grad.dtype == dtype
    torch.testing.assert_close(y.grad.double(), ref, rtol=8e-3, atol=0)
    # float64 is summed as it is
    x64 = x.double().requires_grad_()
    out64 = sum_children(x64, level, parent_level)
    assert out64.dtype == torch.float64
    torch.testing.assert_close(out64, ref, rtol=1e-14, atol=0)


@pytest.mark.parametrize("row", ROWS, ids=str)
def test_traced_run_sums_equal_eager_ones(row):
    """Traced by ``torch.compile``, wide rows too are summed by ``segment_reduce`` (the
    CPU's ``index_add`` would become atomic adds in inductor): the same sums and gradients
    as eager (dynamo only, the eager backend; float64)."""
    lengths = torch.tensor([5, 0, 7, 1, 3])
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(16, *row, generator=gen, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(5, *row, generator=gen, dtype=torch.float64)
    torch._dynamo.reset()
    traced = torch.compile(sum_runs, backend="eager", fullgraph=True)
    got, want = traced(x, lengths), sum_runs(x, lengths)
    torch.testing.assert_close(got, want, atol=1e-14, rtol=0)
    (got_grad,), (want_grad,) = (torch.autograd.grad(y, x, grad) for y in (got, want))
    torch.testing.assert_close(got_grad, want_grad, atol=0, rtol=0)
