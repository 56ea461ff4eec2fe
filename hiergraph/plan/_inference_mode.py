"""Building a plan, or a part of it built on first use, outside ``torch.inference_mode()``."""

from __future__ import annotations

from functools import wraps

import torch


def outside_inference_mode(build):
    """``build``, run outside ``torch.inference_mode()``: a plan, or a part of it built on
    first use, that an evaluation under inference mode asked for first then serves training
    too (inference tensors cannot be saved for backward)."""

    @wraps(build)
    def outside(*args, **kwargs):
        if not torch.is_inference_mode_enabled():  # the usual case: no mode to leave
            return build(*args, **kwargs)
        with torch.inference_mode(False):
            return build(*args, **kwargs)

    return outside
