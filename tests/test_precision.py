"""The accumulation dtype of low-precision tensors and the autocast helpers."""

import pytest
import torch

from hiergraph._precision import accumulation_dtype, autocast_dtype, autocast_off
from tests.conftest import DispatchedOps


@pytest.mark.parametrize(
    "dtype,work",
    [
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
        (torch.int64, torch.int64),
        (torch.int32, torch.int32),
    ],
)
def test_accumulation_dtype(dtype, work):
    assert accumulation_dtype(dtype) == work
    with DispatchedOps() as ops:  # read on every op call: nothing dispatched
        accumulation_dtype(dtype)
    assert ops.calls == []


def test_autocast_dtype_and_autocast_off():
    """The active autocast dtype per device type (``None`` when off or where a device has
    no autocast, e.g. ``meta``), and a block that turns it off (a no-op on such devices)."""
    assert autocast_dtype("cpu") is None and autocast_dtype("meta") is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert autocast_dtype("cpu") == torch.bfloat16
        with autocast_off("cpu"):
            assert autocast_dtype("cpu") is None
        with autocast_off("meta"):
            assert autocast_dtype("cpu") == torch.bfloat16


def test_compiled_code_does_not_ask_whether_a_device_has_autocast(monkeypatch):
    """Some ``torch.compile`` releases cannot trace ``torch.amp.is_autocast_available``:
    while compiling, the answer is taken as yes (every device they compile for has it)."""

    def untraceable(device_type):
        raise AssertionError("asked while compiling")

    monkeypatch.setattr(torch.amp, "is_autocast_available", untraceable)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert autocast_dtype("cpu") == torch.bfloat16
    assert autocast_dtype("cpu") is None
    assert isinstance(autocast_off("cpu"), torch.autocast)
