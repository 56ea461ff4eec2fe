"""The dtype in which sums, counts and logs of low-precision tensors are accumulated."""

from __future__ import annotations

import torch


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """``float32`` for ``float16``/``bfloat16`` (and ``float32``), ``float64`` for ``float64``;
    other (integer) dtypes are returned as they are.

    Half-precision running sums stall (bf16 ones add up to 256) and overflow (fp16 past
    65504); sums, counts and logs are therefore taken in this dtype and only their results
    are rounded to ``dtype``. The rule is static in the dtype: no host sync, no graph break.
    """
    return torch.promote_types(dtype, torch.float32) if dtype.is_floating_point else dtype
