import pytest
import torch

from hiergraph.nn import TypedLinear


def test_one_map_per_type_and_plain_linear_for_one_type():
    lin = TypedLinear(3, 2, num_types=2)
    x, types = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    out = lin(x, types)
    weight, bias = lin.lin.weight, lin.lin.bias  # [types, in, out], [types, out]
    for i, t in enumerate(types.tolist()):
        torch.testing.assert_close(out[i], x[i] @ weight[t] + bias[t])
    single = TypedLinear(3, 2)
    torch.testing.assert_close(single(x), single.lin(x))


def test_bad_type_vectors():
    lin = TypedLinear(3, 2, num_types=2)
    x = torch.randn(4, 3)
    with pytest.raises(ValueError, match="pass type_vec"):
        lin(x)
    with pytest.raises(ValueError, match=r"type ids span 0\.\.2; .* num_types = 2"):
        lin(x, torch.tensor([0, 1, 2, 0]))
    with pytest.raises(ValueError, match=r"type ids span -1\.\.1"):  # not another type's map
        lin(x, torch.tensor([0, -1, 1, 0]))
    with pytest.raises(ValueError, match=r"type_vec must have shape \[4\]"):
        lin(x, torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match="num_types must be >= 1"):
        TypedLinear(3, 2, num_types=0)
