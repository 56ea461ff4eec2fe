from __future__ import annotations

import pytest
import torch

from hiergraph._checks import check_bool, check_fractions, check_ids, check_qkv_like, refuse_where
from hiergraph._device import cpu_as_accelerator
from tests.host_sync import HostSyncRecorder


def test_ids_out_of_range_name_the_range_and_the_argument():
    check_ids(torch.tensor([0, 3, 1]), 4, "type", "num_types")
    check_ids(torch.tensor([], dtype=torch.long), 0, "type", "num_types")
    with pytest.raises(ValueError, match=r"^type ids span 0\.\.4; .* \[0, num_types = 4\)$"):
        check_ids(torch.tensor([0, 4]), 4, "type", "num_types")
    with pytest.raises(ValueError, match=r"^key ids span -1\.\.2"):
        check_ids(torch.tensor([2, -1]), 4, "key", "num_keys")


def test_off_the_cpu_a_device_side_assertion_without_host_reads():
    with cpu_as_accelerator():
        with HostSyncRecorder() as rec:
            check_ids(torch.tensor([0, 3]), 4, "type", "num_types")
        assert rec.unique_syncs() == []
        # (the assertion's CPU kernel raises at once)
        with pytest.raises(RuntimeError, match=r"type ids must lie in \[0, num_types = 4\)"):
            check_ids(torch.tensor([0, 4]), 4, "type", "num_types")
        with HostSyncRecorder() as rec:  # (an embedding's lookup asserts by itself)
            check_ids(torch.tensor([0, 4]), 4, "token", "vocab_size", device_assert=False)
        assert rec.unique_syncs() == []


@pytest.mark.parametrize("which", ["k", "v"])
def test_attention_ops_name_a_key_or_value_on_another_device(which):
    """(A compiled kernel's or ``index_copy``'s error before, naming neither.)"""
    from hiergraph.data import window_hierarchy
    from hiergraph.ops import causal_hierarchical_attention, hierarchical_attention

    tree = window_hierarchy(8, (2, 2))
    x = {name: torch.randn(8, 1, 4) for name in "qkv"}
    x[which] = x[which].to("meta")
    with pytest.raises(ValueError, match=r"q, k, v must be on one device, got cpu, "):
        check_qkv_like(x["q"], x["k"], x["v"])
    for op in (hierarchical_attention, causal_hierarchical_attention):
        with pytest.raises(ValueError, match="q, k, v must be on one device"):
            op(x["q"], x["k"], x["v"], tree)


@pytest.mark.parametrize("flag", ["include_self", "causal", "leaky_causal", "size_bias"])
@pytest.mark.parametrize("value", ["no", None, 1])
def test_flags_that_are_not_bools_are_refused(flag, value):
    """(``"no"`` was true, ``None`` false, and the compiled kernel raised pybind's error.)"""
    from hiergraph.data import window_hierarchy
    from hiergraph.ops import hierarchical_attention

    q = torch.randn(8, 1, 4)
    with pytest.raises(TypeError, match=f"{flag} must be a bool, got {value!r}"):
        hierarchical_attention(q, q, q, window_hierarchy(8, (2, 2)), **{flag: value})


def test_flags_are_bools_of_python_numpy_or_a_0d_tensor():
    import numpy as np

    for flag in (True, np.bool_(False), torch.tensor(True)):
        check_bool(flag, "causal")
    for wrong in ("no", 1, None, torch.tensor([True]), torch.tensor(1), np.array([True])):
        with pytest.raises(TypeError, match="causal must be a bool"):
            check_bool(wrong, "causal")


def test_refuse_where_reads_the_host_or_asserts_on_the_device():
    from hiergraph._device import cpu_as_accelerator

    refuse_where(torch.tensor(False), "never")
    with pytest.raises(ValueError, match=r"^lengths out of range: \[-1, 2\]$"):
        refuse_where(torch.tensor(True), "lengths out of range", found=lambda: "[-1, 2]")
    with cpu_as_accelerator(), pytest.raises(RuntimeError, match="lengths out of range"):
        refuse_where(torch.tensor(True), "lengths out of range", found=lambda: "unread")


def test_fractions_are_numbers_in_0_1_that_sum_to_1():
    assert check_fractions((0.7, 0.15, 0.15)) == [0.7, 0.15, 0.15]
    assert check_fractions(x for x in (1, 0)) == [1, 0]  # read once
    assert check_fractions(torch.tensor([0.75, 0.25], dtype=torch.float64)) == [0.75, 0.25]
    for bad in ((float("nan"), 0.5, 0.5), (1.5, -0.25, -0.25), (float("inf"), 0.0)):
        with pytest.raises(ValueError, match=r"fractions must be numbers in \[0, 1\]"):
            check_fractions(bad)
    for bad in ((0.5, 0.4), ()):
        with pytest.raises(ValueError, match="fractions must sum to 1"):
            check_fractions(bad)
    for bad in ((True, False), ("0.5", "0.5"), torch.tensor([1, 0])):
        with pytest.raises(TypeError, match="fractions must be numbers"):
            check_fractions(bad)
