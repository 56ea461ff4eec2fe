"""take_rows: a gather of distinct rows with a copy-only backward."""

import pytest
import torch

from hiergraph.ops.rows import take_rows


@pytest.mark.parametrize("dim", [0, 1])
def test_is_index_select_differentiable_twice(dim):
    x = torch.randn(5, 4, 2, dtype=torch.float64, requires_grad=True)
    index = torch.tensor([3, 0, 2])
    torch.testing.assert_close(take_rows(x, index, dim), x.index_select(dim, index))
    assert torch.autograd.gradcheck(lambda y: take_rows(y, index, dim), (x,))
    assert torch.autograd.gradgradcheck(lambda y: take_rows(y, index, dim), (x,))
