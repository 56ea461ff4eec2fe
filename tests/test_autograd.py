import torch

from hiergraph._autograd import records_grad


def test_records_grad_needs_grad_mode_and_a_tensor_that_requires_it():
    x, w = torch.zeros(2), torch.zeros(2, requires_grad=True)
    assert records_grad(x, None, w) and not records_grad(x, None)
    with torch.no_grad():
        assert not records_grad(w)
    with torch.inference_mode():
        assert not records_grad(w)
