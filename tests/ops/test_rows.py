"""take_rows and permute_rows: gathers of distinct rows with a copy or gather backward."""

import pytest
import torch

from hiergraph.ops.rows import permute_rows, take_rows


@pytest.mark.parametrize("dim", [0, 1])
def test_is_index_select_differentiable_twice(dim):
    x = torch.randn(5, 4, 2, dtype=torch.float64, requires_grad=True)
    index = torch.tensor([3, 0, 2])
    torch.testing.assert_close(take_rows(x, index, dim), x.index_select(dim, index))
    assert torch.autograd.gradcheck(lambda y: take_rows(y, index, dim), (x,))
    assert torch.autograd.gradgradcheck(lambda y: take_rows(y, index, dim), (x,))


@pytest.mark.parametrize("dim", [0, 1])
def test_permute_rows_is_index_select_differentiable_twice(dim):
    x = torch.randn(4, 4, 2, dtype=torch.float64, requires_grad=True)
    perm = torch.tensor([2, 0, 3, 1])
    inverse = torch.argsort(perm)
    torch.testing.assert_close(permute_rows(x, perm, inverse, dim), x.index_select(dim, perm))
    assert torch.autograd.gradcheck(lambda y: permute_rows(y, perm, inverse, dim), (x,))
    assert torch.autograd.gradgradcheck(lambda y: permute_rows(y, perm, inverse, dim), (x,))
