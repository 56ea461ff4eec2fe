"""Whether autograd records an operation: the switch of paths that are faster without it."""

from __future__ import annotations

import torch
from torch import Tensor


def records_grad(*tensors: Tensor | None) -> bool:
    """Whether an operation on ``tensors`` would be recorded by autograd: grad mode is on and
    one of them (``None`` entries skipped) requires a gradient."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
