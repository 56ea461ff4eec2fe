"""The dtype in which sums, counts and logs of low-precision tensors are accumulated, and
the autocast state the ops that keep those sums run under (:func:`autocast_inputs`)."""

from __future__ import annotations

import functools
from contextlib import AbstractContextManager, nullcontext

import torch


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """``float32`` for ``float16``/``bfloat16`` (and ``float32``), ``float64`` for ``float64``;
    other (integer) dtypes are returned as they are.

    Half-precision running sums stall (bf16 ones add up to 256) and overflow (fp16 past
    65504); sums, counts and logs are therefore taken in this dtype and only their results
    are rounded to ``dtype``. The rule is static in the dtype: no host sync, no graph break,
    and no operation dispatched (``torch.promote_types`` would be one, on every call).
    """
    if not dtype.is_floating_point or dtype == torch.float64:
        return dtype
    return torch.float32


def widened(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """``tensors`` in their :func:`accumulation_dtype` (bf16/fp16 as float32, a copy; others
    as they are; ``None`` kept): the inputs of an op computed in float32 whose output is
    rounded once to the inputs' dtype."""
    return [t.float() if t is not None and t.dtype in _HALF else t for t in tensors]


_HALF = (torch.float16, torch.bfloat16)  # (a set test: no promote_types dispatched per call)


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The autocast dtype active on ``device_type``, or ``None`` (autocast off, or a device
    without autocast, such as ``meta``)."""
    if not _has_autocast(device_type):
        return None
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def autocast_off(device_type: str) -> AbstractContextManager:
    """Autocast disabled on ``device_type`` within the block (a no-op on devices without
    autocast): ops that pick their own accumulation dtype run as written."""
    if not _has_autocast(device_type):
        return nullcontext()
    return torch.autocast(device_type, enabled=False)


def _has_autocast(device_type: str) -> bool:
    """Whether ``device_type`` has autocast. Under ``torch.compile`` the answer is ``True``
    without asking: some releases cannot trace the query, and the devices they compile for
    (CPU, CUDA, XPU, ...) all have autocast."""
    return torch.compiler.is_compiling() or torch.amp.is_autocast_available(device_type)


def autocast_inputs(op):
    """Decorates an attention op ``op(q, k, v, ...)``: under autocast on ``q``'s device,
    ``q, k, v`` are cast to the autocast dtype (as
    :func:`~torch.nn.functional.scaled_dot_product_attention` casts them; layers upstream
    hand over mixed dtypes, since autocast keeps e.g. layer norms in float32) and the op
    runs with autocast off, so the sums it keeps in float32 stay in float32."""

    @functools.wraps(op)
    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args, **kwargs):
        check_tensors(q, k, v)
        dtype = autocast_dtype(q.device.type)
        if dtype is None:
            return op(q, k, v, *args, **kwargs)
        q, k, v = (t.to(dtype) if t.is_floating_point() else t for t in (q, k, v))
        with autocast_off(q.device.type):
            return op(q, k, v, *args, **kwargs)

    return run


def check_tensors(q, k, v) -> None:
    """``TypeError`` unless ``q``, ``k`` and ``v`` are tensors."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
