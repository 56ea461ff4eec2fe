import torch

from hiergraph._versions import guard_holds, in_place_versions, version_guard


def test_a_guard_holds_until_its_tensors_are_written_or_replaced():
    a, b = torch.zeros(3), torch.ones(2)
    guard = version_guard(a, b)
    assert guard_holds(guard, a, b)
    assert not guard_holds(guard, a.clone(), b)  # equal values, another tensor
    assert not guard_holds(guard, a)  # another number of tensors
    b.add_(1)
    assert not guard_holds(guard, a, b)


def test_inference_tensors_have_no_guard():
    with torch.inference_mode():
        a = torch.zeros(3)
    assert in_place_versions(a, torch.zeros(1)) is None
    assert version_guard(a) is None
    assert not guard_holds(None, a)
