"""The accumulation dtype of low-precision tensors."""

import pytest
import torch

from hiergraph._precision import accumulation_dtype


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
