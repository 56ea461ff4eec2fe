import pytest
import torch
from torch_geometric.nn import HeteroLinear

from hiergraph.nn import TypedLinear
from tests.conftest import unordered_backward_nodes


def test_one_map_per_type_and_plain_linear_for_one_type():
    lin = TypedLinear(3, 2, num_types=2)
    x, types = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    out = lin(x, types)
    weight, bias = lin.lin.weight, lin.type_bias  # [types, in, out], [types, out]
    for i, t in enumerate(types.tolist()):
        torch.testing.assert_close(out[i], x[i] @ weight[t] + bias[t])
    single = TypedLinear(3, 2)
    torch.testing.assert_close(single(x), single.lin(x))


def test_same_init_and_output_as_hetero_linear_and_its_state_dicts_load():
    """The per-type bias lives in ``type_bias`` (gathered with ``index_select``) but is
    initialised, applied and loaded as ``HeteroLinear``'s own bias was."""
    torch.manual_seed(0)
    ref = HeteroLinear(3, 2, num_types=4)
    torch.manual_seed(0)
    lin = TypedLinear(3, 2, num_types=4)
    assert torch.equal(lin.lin.weight, ref.weight) and torch.equal(lin.type_bias, ref.bias)
    x, types = torch.randn(9, 3), torch.tensor([3, 0, 1, 1, 2, 0, 3, 3, 1])
    assert torch.equal(lin(x, types), ref(x, types))
    fresh = TypedLinear(3, 2, num_types=4)
    fresh.load_state_dict(ref.state_dict(prefix="lin."))  # keys lin.weight, lin.bias
    assert torch.equal(fresh(x, types), ref(x, types))
    assert unordered_backward_nodes(lin(x, types)) == []
    assert TypedLinear(3, 2, num_types=4, bias=False).type_bias is None


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
    for wrong in (torch.tensor([0.0, 1.0, 1.0, 0.0]), torch.tensor([False, True, True, False])):
        with pytest.raises(TypeError, match="type_vec must be an integer tensor"):
            lin(x, wrong)  # (a NotImplementedError from deep inside)
    one = TypedLinear(3, 2)  # one type: the types are not read (a one-type layer of typed trees)
    assert torch.equal(one(x, torch.tensor([0, 5, 1, 0])), one(x))
    with pytest.raises(ValueError, match="num_types must be a positive int"):
        TypedLinear(3, 2, num_types=0)
    with pytest.raises(TypeError, match="num_types must be a positive int"):
        TypedLinear(3, 2, num_types=2.5)
    with pytest.raises(ValueError, match="out_channels must be a positive int"):
        TypedLinear(3, -3)
    for num_types in (1, 2):  # (bias="no" learned a bias)
        with pytest.raises(TypeError, match="bias must be a bool, got 'no'"):
            TypedLinear(3, 2, num_types=num_types, bias="no")


def test_repr():
    assert repr(TypedLinear(3, 2, num_types=4)) == "TypedLinear(3, 2, num_types=4)"


def test_type_ids_out_of_range_fail_on_an_accelerator_too():
    """On an accelerator the ids are not read on the host; a device-side assertion stops
    them (they would match no type and give zero rows)."""
    from hiergraph._device import cpu_as_accelerator

    lin = TypedLinear(3, 2, num_types=2, bias=False)
    x = torch.randn(4, 3)
    for ids in (torch.tensor([0, 1, 5, 0]), torch.tensor([0, -1, 1, 1])):
        with pytest.raises(ValueError, match="type ids span"):
            lin(x, ids)
        with cpu_as_accelerator(), pytest.raises(RuntimeError, match="type ids must lie"):
            lin(x, ids)
    with cpu_as_accelerator():
        ok = lin(x, torch.tensor([0, 1, 1, 0]))
    torch.testing.assert_close(ok, lin(x, torch.tensor([0, 1, 1, 0])))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_small_integer_type_ids_take_the_type_bias(dtype):
    """(With a bias, they failed in ``index_select``, which takes int32/int64 ids only.)"""
    torch.manual_seed(0)
    layer = TypedLinear(3, 2, num_types=3, bias=True)
    x, types = torch.randn(5, 3), torch.tensor([0, 2, 1, 2, 0])
    torch.testing.assert_close(layer(x, types.to(dtype)), layer(x, types))
